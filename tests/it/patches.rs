//! `hallmark patches`: import, report and refresh on real git repositories made here, whose
//! history moves under a patch series the way an upstream pin bump does.

use crate::support;

use serde_json::Value;
use support::{GitRepo, TestProject, document};

const BASE_DIGEST: &str = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

/// `prefix1` .. `prefixN`, one per line.
fn numbered(prefix: &str, lines: usize) -> String {
    (1..=lines).map(|i| format!("{prefix}{i}\n")).collect()
}

/// Line `line` (1-based) of `text` replaced by `new`.
fn with_line(text: &str, line: usize, new: &str) -> String {
    text.lines()
        .enumerate()
        .map(|(i, l)| format!("{}\n", if i + 1 == line { new } else { l }))
        .collect()
}

/// Upstream at `v1`, a branch `dcp` of five patches on it, and `v2` on main, which moves
/// under them: five lines on top of a.txt (0001 and 0005 move), 0002's change merged,
/// a context line of 0003 changed (a three-way merge takes it), 0004's line changed otherwise
/// (a conflict). 0005 changes the line after 0001's: it applies only after 0001.
pub(crate) struct Upstream {
    pub(crate) repo: GitRepo,
    pub(crate) v1: String,
    pub(crate) v2: String,
}

pub(crate) fn upstream(parent: &std::path::Path) -> Upstream {
    let repo = GitRepo::new(parent, "upstream");
    let (a, b, c, d) = (
        numbered("a", 40),
        numbered("b", 40),
        numbered("c", 40),
        numbered("d", 40),
    );
    let v1 = repo.commit(
        &[("a.txt", &a), ("b.txt", &b), ("c.txt", &c), ("d.txt", &d)],
        "v1",
    );
    repo.git(&["tag", "v1"]);
    repo.git(&["checkout", "--quiet", "-b", "dcp"]);
    let a1 = with_line(&a, 20, "a20 patched");
    repo.commit(&[("a.txt", &a1)], "Move a20");
    repo.commit(&[("b.txt", &with_line(&b, 10, "b10 fixed"))], "Fix b10");
    repo.commit(
        &[("c.txt", &with_line(&c, 20, "c20 patched"))],
        "Change c20",
    );
    repo.commit(&[("d.txt", &with_line(&d, 10, "d10 ours"))], "Change d10");
    repo.commit(
        &[("a.txt", &with_line(&a1, 21, "a21 after a20"))],
        "Change a21 after a20",
    );
    repo.git(&["checkout", "--quiet", "main"]);
    let v2 = repo.commit(
        &[
            ("a.txt", &format!("{}{a}", numbered("new", 5))),
            ("b.txt", &with_line(&b, 10, "b10 fixed")),
            ("c.txt", &with_line(&c, 17, "c17 upstream")),
            ("d.txt", &with_line(&d, 10, "d10 theirs")),
        ],
        "v2",
    );
    repo.git(&["tag", "v2"]);
    Upstream { repo, v1, v2 }
}

/// An image `app` whose source `upstream` is pinned at `commit` and applies set `dcp`.
pub(crate) fn project_at(upstream: &Upstream, rev: &str, commit: &str) -> TestProject {
    let project = TestProject::new();
    write_image(&project, upstream, rev, commit);
    project
}

fn write_image(project: &TestProject, upstream: &Upstream, rev: &str, commit: &str) {
    let url = upstream.repo.url();
    project
        .write(
            "images/app/image.toml",
            &format!(
                "[from]\nref = \"example/base:1\"\n\n[[source]]\nname = \"upstream\"\n\
                 git = \"{url}\"\nrev = \"{rev}\"\ndest = \"/src/upstream\"\npatches = [\"dcp\"]\n"
            ),
        )
        .write(
            "pins/app.toml",
            &format!(
                "[base]\nref = \"example/base:1\"\ndigest = \"{BASE_DIGEST}\"\n\n[[source]]\n\
                 name = \"upstream\"\ngit = \"{url}\"\nrev = \"{rev}\"\ncommit = \"{commit}\"\n"
            ),
        );
}

/// Each row's `status` by its patch file.
fn statuses(report: &Value) -> Vec<(String, String)> {
    report
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["patch"].as_str().unwrap().to_string(),
                r["status"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// What a user reads of `run` (support::transcript), the temporary folder `tmp` (where the
/// upstream repository is) written `[tmp]` and commit ids `[hex]`.
fn said(project: &TestProject, run: &support::Run, tmp: &std::path::Path) -> String {
    let text = support::transcript(project, run);
    support::without_hex(&support::without_dir(&text, tmp, "[tmp]"))
}

fn row<'a>(report: &'a Value, prefix: &str) -> &'a Value {
    report
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["patch"].as_str().unwrap().starts_with(prefix))
        .unwrap_or_else(|| panic!("no patch {prefix} in {report:#}"))
}

#[test]
fn the_report_at_a_bumped_pin_names_each_status_and_refresh_makes_a_series_check_passes() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = upstream(dir.path());
    let project = project_at(&upstream, "v1", &upstream.v1);
    let url = upstream.repo.url();

    // Imported from the branch; at the pin, every patch applies (0005 only after 0001).
    let import = project.run(&["--json", "patches", "import", "dcp", &url, "v1..dcp"]);
    assert_eq!(import.code(), 0, "{}", import.stderr());
    let at_pin = document(&import.stdout());
    assert!(
        statuses(&at_pin).iter().all(|(_, s)| s == "applies"),
        "{at_pin:#}"
    );
    assert_eq!(row(&at_pin, "0005")["after"][0], "dcp/0001-Move-a20.patch");
    assert_eq!(row(&at_pin, "0003")["after"].as_array().unwrap().len(), 0);
    project.run(&["check", "app"]).success();

    // At v2: one of each.
    let bumped = project.run(&["--json", "patches", "report", "app", "--rev", "v2"]);
    assert_eq!(bumped.code(), 1, "{}", bumped.stderr());
    let report = document(&bumped.stdout());
    let expected = [
        ("0001-Move-a20.patch", "offset"),
        ("0002-Fix-b10.patch", "upstream"),
        ("0003-Change-c20.patch", "three-way"),
        ("0004-Change-d10.patch", "conflicts"),
        ("0005-Change-a21-after-a20.patch", "offset"),
    ];
    let expected: Vec<(String, String)> = expected
        .iter()
        .map(|(p, s)| (p.to_string(), s.to_string()))
        .collect();
    assert_eq!(statuses(&report), expected, "{report:#}");
    assert_eq!(row(&report, "0001")["offset"], 5);
    assert_eq!(row(&report, "0001")["commit"], upstream.v2.as_str());
    let conflict = &row(&report, "0004")["conflicts"][0];
    assert_eq!(conflict["file"], "d.txt");
    assert_eq!(conflict["hunk"], "#1 @@ -7,7 +7,7 @@ d6");
    // The table says the same to a reader.
    let table = project.run(&["patches", "report", "app", "--rev", "v2"]);
    assert_eq!(table.code(), 1, "{}", table.stderr());
    insta::assert_snapshot!("report_at_a_bumped_pin", said(&project, &table, dir.path()));

    // With a conflict, refresh rewrites nothing unless asked.
    let before: Vec<(String, String)> = files_of(&project);
    let refused = project.run(&["patches", "refresh", "app", "--rev", "v2"]);
    assert_eq!(refused.code(), 1, "{}", refused.stderr());
    assert_eq!(files_of(&project), before);

    let forced = project.run(&["patches", "refresh", "app", "--rev", "v2", "--force"]);
    assert_eq!(forced.code(), 1, "{}", forced.stderr());
    assert!(
        !project
            .root()
            .join("patches/dcp/0002-Fix-b10.patch")
            .exists()
    );
    let series = project.read("patches/dcp/series");
    assert!(!series.contains("0002"), "{series}");
    let untouched = before.iter().find(|(n, _)| n.starts_with("0004")).unwrap();
    assert_eq!(
        project.read("patches/dcp/0004-Change-d10.patch"),
        untouched.1
    );
    // A three-way (or fuzz) match is doubtful: left as it is, saying where it would land
    // and where it was, until asked for (an outside test saw a fuzzed hunk rewritten into
    // another function, and refresh exit 0).
    let doubtful = before.iter().find(|(n, _)| n.starts_with("0003")).unwrap();
    assert_eq!(
        project.read("patches/dcp/0003-Change-c20.patch"),
        doubtful.1
    );
    let accepted = project.run(&[
        "patches",
        "refresh",
        "app",
        "--rev",
        "v2",
        "--force",
        "--accept-fuzz",
    ]);
    assert_eq!(accepted.code(), 1, "{}", accepted.stderr());
    // What refresh says each time: nothing rewritten; 0002 dropped, 0004 and the doubtful
    // 0003 left (where it would land, where it was); then 0003 rewritten.
    let runs = [
        ("refresh", &refused),
        ("refresh --force", &forced),
        ("refresh --force --accept-fuzz", &accepted),
    ];
    let refreshes: String = runs
        .iter()
        .map(|(args, run)| {
            let text = said(&project, run, dir.path());
            format!("## patches {args} app --rev v2\n{text}\n")
        })
        .collect();
    insta::assert_snapshot!("refresh_at_a_bumped_pin", refreshes);
    // The mail header stays on a rewritten patch.
    let rewritten = project.read("patches/dcp/0003-Change-c20.patch");
    assert!(
        rewritten.contains("Subject: [PATCH 3/5] Change c20"),
        "{rewritten}"
    );
    assert!(rewritten.contains("\n c17 upstream\n"), "{rewritten}");

    // The operator drops the conflicting patch; at v2 the series now applies as it is, and
    // once the pin moves there `check` passes.
    project.write(
        "patches/dcp/series",
        &series.replace("0004-Change-d10.patch\n", ""),
    );
    project
        .run(&["patches", "report", "app", "--rev", "v2"])
        .success();
    assert_eq!(
        project.run(&["check", "app"]).code(),
        1,
        "still pinned at v1"
    );
    write_image(&project, &upstream, "v2", &upstream.v2);
    project.run(&["check", "app"]).success();
}

/// The set's files and their text, sorted.
fn files_of(project: &TestProject) -> Vec<(String, String)> {
    let dir = project.root().join("patches/dcp");
    let mut files: Vec<(String, String)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read_to_string(&p).unwrap(),
            )
        })
        .collect();
    files.sort();
    files
}

#[test]
fn a_folder_of_23_numbered_patches_and_its_git_range_import_as_the_same_series() {
    let dir = tempfile::tempdir().unwrap();
    let repo = GitRepo::new(dir.path(), "tree");
    repo.commit(&[("base.txt", "base\n")], "base");
    repo.git(&["tag", "start"]);
    for i in 1..=23 {
        let file = format!("src/f{i}.py");
        repo.commit(
            &[(file.as_str(), &format!("N = {i}\n"))],
            &format!("Add f{i}"),
        );
    }
    let folder = dir.path().join("dcp2");
    repo.git(&[
        "format-patch",
        "--quiet",
        "-o",
        folder.to_str().unwrap(),
        "start..main",
    ]);
    // Shuffled on disk order must not matter; 10 sorts after 9.
    let project = TestProject::new();
    project
        .run(&["patches", "import", "from-folder", folder.to_str().unwrap()])
        .success();
    project
        .run(&[
            "patches",
            "import",
            "from-range",
            &repo.url(),
            "start..main",
        ])
        .success();
    let series = project.read("patches/from-folder/series");
    assert_eq!(series.lines().count(), 23);
    assert!(
        series.lines().nth(9).unwrap().starts_with("0010-Add-f10"),
        "{series}"
    );
    assert_eq!(series, project.read("patches/from-range/series"));
    for name in series.lines() {
        assert_eq!(
            project.read(&format!("patches/from-folder/{name}")),
            project.read(&format!("patches/from-range/{name}")),
            "{name}"
        );
    }
    // An mbox of the same commits gives the same patch names.
    let mbox = repo.git(&["format-patch", "--stdout", "start..main"]);
    std::fs::write(dir.path().join("all.mbox"), format!("{mbox}\n")).unwrap();
    project
        .run(&[
            "patches",
            "import",
            "from-mbox",
            dir.path().join("all.mbox").to_str().unwrap(),
        ])
        .success();
    assert_eq!(project.read("patches/from-mbox/series"), series);
    // An existing set is not replaced unless asked.
    let again = project.run(&["patches", "import", "from-folder", folder.to_str().unwrap()]);
    assert_eq!(again.code(), 2, "{}", again.stderr());
    project
        .run(&[
            "patches",
            "import",
            "from-folder",
            folder.to_str().unwrap(),
            "--force",
        ])
        .success();
}

#[test]
fn bad_input_exits_2_naming_the_file_or_range() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = upstream(dir.path());
    let project = project_at(&upstream, "v1", &upstream.v1);
    let said = std::cell::RefCell::new(String::new());
    // Each exits 2; the snapshot holds what each says (the file, range or name it is about).
    let expect = |args: &[&str]| {
        let run = project.run(args);
        assert_eq!(run.code(), 2, "{args:?}: {}", run.stderr());
        let command = support::without_dir(&args.join(" "), dir.path(), "[tmp]");
        let text = self::said(&project, &run, dir.path());
        said.borrow_mut()
            .push_str(&format!("## hallmark {command}\n{text}\n"));
    };
    // The image lists set `dcp`, which does not exist.
    expect(&["patches", "report", "app"]);
    expect(&["patches", "report", "nosuch"]);
    project.write("patches/dcp/series", "0001-a.patch\n").write(
        "patches/dcp/0001-a.patch",
        &line_patch("a.txt", "a", 1, "a1 fixed"),
    );
    project.run(&["patches", "report", "app"]).success();
    expect(&["patches", "report", "app", "--rev", "nosuch"]);
    expect(&["patches", "report", "app", "--rev", &"0".repeat(40)]);

    let escaping = dir.path().join("escaping");
    std::fs::create_dir_all(&escaping).unwrap();
    std::fs::write(
        escaping.join("0001-ok.patch"),
        "--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n",
    )
    .unwrap();
    std::fs::write(
        escaping.join("0002-out.patch"),
        "--- a/../../etc/passwd\n+++ b/../../etc/passwd\n@@ -1 +1 @@\n-a\n+b\n",
    )
    .unwrap();
    expect(&["patches", "import", "x", escaping.to_str().unwrap()]);

    let notes = dir.path().join("notes");
    std::fs::create_dir_all(&notes).unwrap();
    std::fs::write(
        notes.join("0001-ok.patch"),
        "--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n",
    )
    .unwrap();
    std::fs::write(notes.join("README"), "apply these in order\n").unwrap();
    expect(&["patches", "import", "x", notes.to_str().unwrap()]);

    let url = upstream.repo.url();
    expect(&["patches", "import", "x", &url, "nosuch..dcp"]);
    expect(&["patches", "import", "x", &url, "dcp"]);
    expect(&["patches", "import", "x", "/nonexistent/folder"]);
    // Nothing was written by any of them.
    assert!(!project.root().join("patches/x").exists());
    insta::assert_snapshot!("bad_input", said.into_inner());
}

/// A diff changing line `line` of a file of `prefix1..prefix40` lines.
fn line_patch(file: &str, prefix: &str, line: usize, new: &str) -> String {
    let old = numbered(prefix, 40);
    let start = line.saturating_sub(3).max(1);
    let end = (line + 3).min(40);
    let mut hunk = format!("@@ -{start},{n} +{start},{n} @@\n", n = end - start + 1);
    for (i, text) in old.lines().enumerate().map(|(i, t)| (i + 1, t)) {
        if i < start || i > end {
            continue;
        }
        if i == line {
            hunk.push_str(&format!("-{text}\n+{new}\n"));
        } else {
            hunk.push_str(&format!(" {text}\n"));
        }
    }
    format!("--- a/{file}\n+++ b/{file}\n{hunk}")
}

/// `app` at v1 with set `fix`, and `dcp2`: `app` plus set `dcp2` and `PROFILE=dcp2`.
fn variant_project(upstream: &Upstream) -> TestProject {
    let project = project_at(upstream, "v1", &upstream.v1);
    let image = project
        .read("images/app/image.toml")
        .replace("[\"dcp\"]", "[\"fix\"]");
    project
        .write("images/app/image.toml", &format!("{image}\n[env]\nMODE = \"base\"\n"))
        .write("patches/fix/series", "0001-a1.patch\n")
        .write("patches/fix/0001-a1.patch", &line_patch("a.txt", "a", 1, "a1 fixed"))
        .write("patches/dcp2/series", "0001-b5.patch\n")
        .write("patches/dcp2/0001-b5.patch", &line_patch("b.txt", "b", 5, "b5 dcp2"))
        .write(
            "images/dcp2/image.toml",
            "[variant]\nof = \"app\"\ntag = \"dcp2\"\n\n[variant.patches]\nupstream = [\"dcp2\"]\n\n\
             [variant.env]\nPROFILE = \"dcp2\"\n",
        )
        .write("pins/dcp2.toml", &project.read("pins/app.toml"));
    project
}

#[test]
fn a_variant_is_its_spec_plus_a_patch_set_and_env_with_its_own_checksum() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = upstream(dir.path());
    let project = variant_project(&upstream);
    project.run(&["check", "app", "dcp2"]).success();
    let sums = project.run(&["checksum", "app", "dcp2"]).success().stdout();
    let sums: Vec<&str> = sums.lines().map(|l| &l[..64]).collect();
    assert_ne!(sums[0], sums[1]);
    let explain = project
        .run(&["checksum", "dcp2", "--explain"])
        .success()
        .stdout();
    assert!(
        explain.contains("patch upstream fix 0001-a1.patch"),
        "{explain}"
    );
    assert!(
        explain.contains("patch upstream dcp2 0001-b5.patch"),
        "{explain}"
    );
    assert!(explain.contains("PROFILE"), "{explain}");
    let base = project
        .run(&["checksum", "app", "--explain"])
        .success()
        .stdout();
    assert!(
        !base.contains("dcp2") && !base.contains("PROFILE"),
        "{base}"
    );
    let render = project.run(&["render", "dcp2"]).success().stdout();
    assert!(
        render.contains("PROFILE") && render.contains("MODE"),
        "{render}"
    );
    assert!(
        !project
            .run(&["render", "app"])
            .success()
            .stdout()
            .contains("PROFILE")
    );
    // The variant's patched tree holds both sets' changes.
    let out = project.root().join("ctx");
    project
        .run(&["render", "dcp2", "--out", out.to_str().unwrap()])
        .success();
    let tree = walkdir_text(&out);
    assert!(
        tree.contains("a1 fixed") && tree.contains("b5 dcp2"),
        "the context holds both sets"
    );
    // The base is unchanged by its variant.
    let report = document(
        &project
            .run(&["--json", "patches", "report", "app"])
            .success()
            .stdout(),
    );
    assert_eq!(statuses(&report).len(), 1);
    let report = document(
        &project
            .run(&["--json", "patches", "report", "dcp2"])
            .success()
            .stdout(),
    );
    assert_eq!(statuses(&report).len(), 2);
}

/// Every file's text under `dir`, concatenated.
fn walkdir_text(dir: &std::path::Path) -> String {
    let mut text = String::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        if path.is_dir() {
            stack.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
        } else if let Ok(content) = std::fs::read(&path) {
            text.push_str(&String::from_utf8_lossy(&content));
        }
    }
    text
}

#[test]
fn a_bad_variant_exits_2_at_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = upstream(dir.path());
    let project = variant_project(&upstream);
    let expect = |spec: &str, says: &[&str]| {
        project.write("images/dcp2/image.toml", spec);
        let run = project.run(&["check", "dcp2"]);
        assert_eq!(run.code(), 2, "{spec}: {}", run.stderr());
        for s in says {
            assert!(
                run.stderr().contains(s),
                "{spec}: should say {s}: {}",
                run.stderr()
            );
        }
    };
    expect(
        "[variant]\nof = \"nosuch\"\n",
        &["images/dcp2/image.toml:2:", "no image `nosuch`"],
    );
    expect(
        "[variant]\nof = \"app\"\n[variant.patches]\nupstream = [\"missing\"]\n",
        &["images/dcp2/image.toml:4:", "patch set `missing`"],
    );
    expect(
        "[variant]\nof = \"app\"\n[variant.patches]\nother = [\"dcp2\"]\n",
        &["images/dcp2/image.toml:4:", "no source `other`"],
    );
    // A variant does not copy the spec: its own tables are refused.
    expect(
        "[variant]\nof = \"app\"\n\n[env]\nX = \"1\"\n",
        &["unknown field `env`"],
    );
    expect(
        "[variant]\nof = \"app\"\n[variant.patches]\nupstream = [\"fix\"]\n",
        &["images/dcp2/image.toml:4:", "listed twice"],
    );
}

/// The diff ids of `reference` on the builder.
fn layers(testbed: &support::Testbed, reference: &str) -> Vec<String> {
    let json = testbed.docker_ok(
        "builder",
        &[
            "image",
            "inspect",
            "--format",
            "{{json .RootFS.Layers}}",
            reference,
        ],
    );
    serde_json::from_str(&json).unwrap()
}

#[test]
fn a_dcp2_variant_builds_with_its_own_checksum_and_ships_only_the_layers_it_changes() {
    let testbed = support::Testbed::get();
    let config = testbed.config();
    let run = support::unique();
    let dir = tempfile::tempdir().unwrap();
    let upstream = upstream(dir.path());
    // This run's own content, so no node holds the source layers from an earlier run.
    upstream
        .repo
        .git(&["checkout", "--quiet", "-b", "run", "v1"]);
    let v1 = upstream.repo.commit(&[("run.txt", &run)], "this run");
    let project = variant_project(&upstream);
    write_image(&project, &upstream, "v1", &v1);
    let image = project
        .read("images/app/image.toml")
        .replace(
            "[from]\nref = \"example/base:1\"",
            "[from]\nref = \"hallmark-testbed/busybox:latest\"",
        )
        .replace("[\"dcp\"]", "[\"fix\"]");
    let pins = crate::support::hello_pins().to_string()
        + &project
            .read("pins/app.toml")
            .split("[[source]]")
            .nth(1)
            .map(|s| format!("\n[[source]]{s}"))
            .unwrap();
    project
        .write(
            "images/app/image.toml",
            &format!("[image]\nname = \"app-{run}\"\n\n{image}\n[env]\nMODE = \"base\"\n"),
        )
        .write("pins/app.toml", &pins)
        .write("pins/dcp2.toml", &pins)
        .write(
            "images/dcp2/image.toml",
            &format!(
                "[variant]\nof = \"app\"\nname = \"dcp2-{run}\"\n\n[variant.patches]\n\
                 upstream = [\"dcp2\"]\n\n[variant.env]\nPROFILE = \"dcp2\"\n"
            ),
        );
    let built = project
        .with_config(&config)
        .run(&["--json", "build", "app", "dcp2"]);
    assert_eq!(built.code(), 0, "{}", built.stderr());
    let sums = project.run(&["checksum", "app", "dcp2"]).success().stdout();
    let sums: Vec<&str> = sums.lines().map(|l| &l[..64]).collect();
    assert_ne!(sums[0], sums[1]);
    let (app, dcp2) = (format!("app-{run}:latest"), format!("dcp2-{run}:latest"));
    assert_eq!(testbed.checksum_label("builder", &app), sums[0]);
    assert_eq!(testbed.checksum_label("builder", &dcp2), sums[1]);
    let cat = ["cat", "/src/upstream/a.txt", "/src/upstream/b.txt"];
    let patched = testbed.run_container("builder", &dcp2, &cat);
    assert!(
        patched.contains("a1 fixed") && patched.contains("b5 dcp2"),
        "{patched}"
    );
    let env = testbed.run_container("builder", &dcp2, &["sh", "-c", "echo $MODE $PROFILE"]);
    assert_eq!(env, "base dcp2");
    assert!(
        !testbed
            .run_container("builder", &app, &cat)
            .contains("b5 dcp2")
    );

    // Shipped after the base, the variant sends only the layers it does not share.
    let (app_layers, dcp2_layers) = (layers(testbed, &app), layers(testbed, &dcp2));
    let changed = dcp2_layers
        .iter()
        .filter(|l| !app_layers.contains(l))
        .count();
    assert!(
        changed >= 1 && changed < dcp2_layers.len(),
        "{app_layers:?} {dcp2_layers:?}"
    );
    let node = testbed
        .nodes()
        .into_iter()
        .find(|n| testbed.kind(n).1 == "classic")
        .expect("a classic-store node");
    for (name, sent) in [("app", None), ("dcp2", Some(changed))] {
        let shipped =
            project
                .with_config(&config)
                .run(&["--json", "distribute", name, "--to", &node]);
        assert_eq!(shipped.code(), 0, "{}", shipped.stderr());
        let rows = support::nodes_of(&document(&shipped.stdout()));
        assert_eq!(rows[0]["verified"], true, "{rows:?}");
        if let Some(sent) = sent {
            assert_eq!(rows[0]["action"], "thin", "{rows:?}");
            assert_eq!(rows[0]["layers_sent"], sent, "{rows:?}");
        }
    }
}

/// Patches as git writes them (`git diff --binary`): a binary file changed, a mode-only
/// change, a pure rename. `check` applies them (real git) and the build context has them
/// applied; an outside test saw the first two refused as "names no file", which `git apply`
/// takes.
#[test]
fn binary_mode_only_and_rename_patches_apply() {
    let parent = tempfile::tempdir().unwrap();
    let repo = GitRepo::new(parent.path(), "upstream");
    std::fs::write(repo.path.join("logo.bin"), [0u8, 1, 2, 3, 255, 0, 7]).unwrap();
    std::fs::write(repo.path.join("run.sh"), "#!/bin/sh\necho run\n").unwrap();
    std::fs::write(repo.path.join("old.txt"), "kept bytes\n").unwrap();
    let commit = repo.commit(&[], "first");
    let project = project_on(&repo, &commit, "git");
    // Each change made in the work tree, written by git, and undone.
    let mut series = String::new();
    let changes: [(&str, &dyn Fn()); 3] = [
        ("binary", &|| {
            std::fs::write(repo.path.join("logo.bin"), [9u8, 0, 8, 0, 255]).unwrap()
        }),
        ("mode", &|| {
            use std::os::unix::fs::PermissionsExt;
            let path = repo.path.join("run.sh");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }),
        ("rename", &|| {
            repo.git(&["mv", "old.txt", "new.txt"]);
        }),
    ];
    for (name, change) in changes {
        change();
        repo.git(&["add", "-A"]);
        let file = project.root().join(format!("patches/git/{name}.patch"));
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        let output = format!("--output={}", file.display());
        repo.git(&["diff", "--cached", "--binary", &output, "HEAD"]);
        repo.git(&["reset", "-q", "--hard", "HEAD"]);
        series.push_str(&format!("{name}.patch\n"));
    }
    project.write("patches/git/series", &series);
    let checked = project.run(&["check", "app"]);
    assert_eq!(checked.code(), 0, "{}", checked.stderr());

    let out = project.root().join("ctx");
    project
        .run(&["render", "app", "--out", out.to_str().unwrap()])
        .success();
    let tree = out.join("sources/upstream");
    assert_eq!(
        std::fs::read(tree.join("logo.bin")).unwrap(),
        [9u8, 0, 8, 0, 255]
    );
    assert!(tree.join("new.txt").is_file() && !tree.join("old.txt").exists());
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(tree.join("run.sh"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o111, 0o111, "{mode:o}");
}

/// `patches import` that wrote the set exits by one rule: only a patch that does not apply
/// fails it. An image that applies the set but has no pins yet is named on stderr (it exited
/// 2 after writing the set), and `--json` always prints a document (it printed nothing when
/// no image applied the set).
#[test]
fn an_import_that_wrote_the_set_exits_by_its_patches_and_always_prints_json() {
    let project = TestProject::new();
    let folder = project.root().join("incoming");
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::write(
        folder.join("0001-a.patch"),
        support::one_line_patch("a.txt", "a", "b"),
    )
    .unwrap();
    let from = folder.to_str().unwrap();

    // No image applies it: a document with no rows.
    let run = project.run(&["--json", "patches", "import", "fresh", from]);
    assert_eq!(run.code(), 0, "{}", run.stderr());
    let rows = document(&run.stdout());
    assert_eq!(rows.as_array().unwrap().len(), 0, "{rows}");

    // An image applies it but has no pins yet: said, not a failure.
    project.write(
        "images/app/image.toml",
        "[from]\nref = \"example/base:1\"\n\n[[source]]\nname = \"up\"\ngit = \"https://example.invalid/up.git\"\nrev = \"main\"\ndest = \"/src/up\"\npatches = [\"later\"]\n",
    );
    let run = project.run(&["--json", "patches", "import", "later", from]);
    let stderr = run.stderr();
    assert_eq!(run.code(), 0, "{stderr}");
    assert!(
        stderr.contains("`app` applies `later` but was not examined"),
        "{stderr}"
    );
    assert!(stderr.contains("hallmark lock app"), "{stderr}");
    assert_eq!(document(&run.stdout()).as_array().unwrap().len(), 0);
    assert!(project.root().join("patches/later/series").is_file());
}

/// A patch whose lines end in CRLF, on a source whose files end in LF, is reported as a
/// conflict that names line endings (it named nothing); one that really conflicts does not
/// get that note.
#[test]
fn a_crlf_patch_is_reported_as_line_endings() {
    let parent = tempfile::tempdir().unwrap();
    let repo = GitRepo::new(parent.path(), "upstream");
    let commit = repo.commit(&[("a.txt", "two\n")], "first");
    let project = project_on(&repo, &commit, "dos");
    let patch = support::one_line_patch("a.txt", "two", "TWO");
    project
        .write("patches/dos/series", "crlf.patch\nreal.patch\n")
        .write("patches/dos/crlf.patch", &patch.replace('\n', "\r\n"))
        .write(
            "patches/dos/real.patch",
            &support::one_line_patch("a.txt", "absent", "x"),
        );
    let run = project.run(&["--json", "patches", "report", "app"]);
    assert_eq!(run.code(), 1, "{}", run.stderr());
    let rows = document(&run.stdout());
    let rows = rows.as_array().unwrap();
    assert_eq!(rows[0]["status"], "conflicts", "{rows:?}");
    let why = rows[0]["whitespace"].as_str().unwrap_or_default();
    assert!(why.contains("CRLF"), "{rows:?}");
    assert_eq!(rows[1]["status"], "conflicts", "{rows:?}");
    assert!(rows[1]["whitespace"].is_null(), "{rows:?}");
    let table = project.run(&["patches", "report", "app"]);
    insta::assert_snapshot!(
        "report_of_a_crlf_patch",
        said(&project, &table, parent.path())
    );
}

/// An image `app` whose source `upstream` is `repo` at `commit` (branch `main`) and applies
/// the patch set `set`.
fn project_on(repo: &GitRepo, commit: &str, set: &str) -> TestProject {
    let project = TestProject::new();
    let url = repo.url();
    project
        .write(
            "images/app/image.toml",
            &format!(
                "[from]\nref = \"example/base:1\"\n\n[[source]]\nname = \"upstream\"\n\
                 git = \"{url}\"\nrev = \"main\"\ndest = \"/src/upstream\"\npatches = [\"{set}\"]\n"
            ),
        )
        .write(
            "pins/app.toml",
            &format!(
                "[base]\nref = \"example/base:1\"\ndigest = \"{BASE_DIGEST}\"\n\n[[source]]\n\
                 name = \"upstream\"\ngit = \"{url}\"\nrev = \"main\"\ncommit = \"{commit}\"\n"
            ),
        );
    project
}

/// A hunk that git applies at an offset, but in another function (two functions with the
/// same body; upstream rewrote the one the patch changed): refresh leaves it as it is and
/// names both places, exit 1 (a second outside test saw it rewritten into `f2`, exit 0).
#[test]
fn an_offset_into_another_function_is_not_rewritten_silently() {
    let parent = tempfile::tempdir().unwrap();
    let repo = GitRepo::new(parent.path(), "upstream");
    let body = "{\n    int y = x;\n    int a = 0;\n    int b = 0;\n    y = y + 1;\n    y = y * 2;\n    return y + a + b;\n}\n";
    let v1 = format!("int f1(int x)\n{body}\nint f2(int x)\n{body}");
    let commit = repo.commit(&[("dup.c", &v1)], "v1");
    let project = project_on(&repo, &commit, "s");
    // The patch changes f1 (made by git, with function names in its hunk headers).
    let patched = v1.replacen("y = y + 1;", "y = y + 100;", 1);
    std::fs::write(repo.path.join("dup.c"), &patched).unwrap();
    let file = project.root().join("patches/s/0001-f1.patch");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    let output = format!("--output={}", file.display());
    repo.git(&["diff", &output]);
    repo.git(&["checkout", "--", "dup.c"]);
    project.write("patches/s/series", "0001-f1.patch\n");
    // A quilt-style header: its `Index:` and rule name the old diff's file.
    let made = project.read("patches/s/0001-f1.patch");
    project.write(
        "patches/s/0001-f1.patch",
        &format!(
            "Description: f1 counts by 100\nIndex: dup.c\n{}\n{made}",
            "=".repeat(67)
        ),
    );
    let original = project.read("patches/s/0001-f1.patch");
    assert!(original.contains("@@ int f1(int x)"), "{original}");
    // Upstream rewrites f1 and adds lines above: the old body now stands only in f2.
    let v2 =
        format!("/* a */\n/* b */\nint f1(int x)\n{{\n    return x;\n}}\n\nint f2(int x)\n{body}");
    repo.commit(&[("dup.c", &v2)], "v2");
    repo.git(&["tag", "v2"]);

    let run = project.run(&["patches", "refresh", "app", "--rev", "v2"]);
    assert_eq!(run.code(), 1, "{}", run.stderr());
    assert_eq!(project.read("patches/s/0001-f1.patch"), original);

    let accepted = project.run(&["patches", "refresh", "app", "--rev", "v2", "--accept-fuzz"]);
    assert_eq!(accepted.code(), 0, "{}", accepted.stderr());
    // Left, then rewritten, each time naming both places with their functions.
    let refreshes = format!(
        "## patches refresh app --rev v2\n{}\n## patches refresh app --rev v2 --accept-fuzz\n{}",
        said(&project, &run, parent.path()),
        said(&project, &accepted, parent.path())
    );
    insta::assert_snapshot!("refresh_of_an_offset_into_another_function", refreshes);
    // The rewritten patch says it came from a doubtful match, keeps its description, drops
    // the stale `Index:` header; `check` at the new pin warns until the mark is deleted.
    let rewritten = project.read("patches/s/0001-f1.patch");
    let first = rewritten.lines().next().unwrap();
    assert!(
        first.starts_with("Hallmark-Review: refreshed from a doubtful match (offset)")
            && first.contains("(in `int f2(int x)`)"),
        "{rewritten}"
    );
    assert!(
        rewritten.contains("Description: f1 counts by 100"),
        "{rewritten}"
    );
    assert!(
        !rewritten.contains("Index:") && !rewritten.contains("====="),
        "{rewritten}"
    );
    let v2 = repo.git(&["rev-parse", "v2"]);
    let pins = project.read("pins/app.toml").replace(&commit, &v2);
    project.write("pins/app.toml", &pins);
    let checked = project.run(&["check", "app"]);
    assert_eq!(checked.code(), 0, "{}", checked.stderr());
    assert!(
        checked
            .stderr()
            .contains("warning: patches/s/0001-f1.patch: refreshed from a doubtful match"),
        "{}",
        checked.stderr()
    );
    let reviewed: String = rewritten
        .split_inclusive('\n')
        .filter(|l| !l.starts_with("Hallmark-Review:"))
        .collect();
    project.write("patches/s/0001-f1.patch", &reviewed);
    let checked = project.run(&["check", "app"]);
    assert_eq!(checked.code(), 0, "{}", checked.stderr());
    assert!(
        !checked.stderr().contains("warning"),
        "{}",
        checked.stderr()
    );
}

/// A quilt series as distributions keep them: a patch in a subfolder, one with `-p0`, an
/// empty one, comments. Import keeps each as quilt reads it (it failed with an I/O error on
/// the subfolder, dropped `-p0`, and refused the empty patch), `check` applies the set, the
/// report calls the empty patch `empty`, and `render` has the patched tree.
#[test]
fn a_quilt_series_with_subfolders_p0_and_an_empty_patch_imports_and_applies() {
    let parent = tempfile::tempdir().unwrap();
    let repo = GitRepo::new(parent.path(), "upstream");
    let commit = repo.commit(&[("a.txt", "a\n"), ("b.txt", "b\n")], "first");
    let project = project_on(&repo, &commit, "quilt");
    let incoming = project.root().join("incoming");
    std::fs::create_dir_all(incoming.join("debian")).unwrap();
    std::fs::write(
        incoming.join("debian/0001-a.patch"),
        support::one_line_patch("a.txt", "a", "A"),
    )
    .unwrap();
    std::fs::write(
        incoming.join("0002-b.patch"),
        "--- b.txt\n+++ b.txt\n@@ -1 +1 @@\n-b\n+B\n",
    )
    .unwrap();
    std::fs::write(incoming.join("0003-empty.patch"), "").unwrap();
    std::fs::write(
        incoming.join("series"),
        "# from the distribution\ndebian/0001-a.patch\n0002-b.patch -p0\n\n0003-empty.patch\n",
    )
    .unwrap();
    let imported = project.run(&["patches", "import", "quilt", incoming.to_str().unwrap()]);
    assert_eq!(imported.code(), 0, "{}", imported.stderr());
    assert_eq!(
        project.read("patches/quilt/series"),
        "debian/0001-a.patch\n0002-b.patch -p0\n0003-empty.patch\n"
    );
    assert_eq!(project.read("patches/quilt/0003-empty.patch"), "");
    let checked = project.run(&["check", "app"]);
    assert_eq!(checked.code(), 0, "{}", checked.stderr());
    let reported = project.run(&["--json", "patches", "report", "app"]);
    let report = document(&reported.stdout());
    assert_eq!(reported.code(), 0, "{report}");
    let states = statuses(&report);
    assert_eq!(
        states,
        [
            ("debian/0001-a.patch".to_string(), "applies".to_string()),
            ("0002-b.patch".to_string(), "applies".to_string()),
            ("0003-empty.patch".to_string(), "empty".to_string()),
        ],
        "{report}"
    );
    let table = project.run(&["patches", "report", "app"]);
    insta::assert_snapshot!(
        "report_of_a_quilt_series",
        said(&project, &table, parent.path())
    );
    let out = project.root().join("ctx");
    project
        .run(&["render", "app", "--out", out.to_str().unwrap()])
        .success();
    let tree = out.join("sources/upstream");
    assert_eq!(std::fs::read_to_string(tree.join("a.txt")).unwrap(), "A\n");
    assert_eq!(std::fs::read_to_string(tree.join("b.txt")).unwrap(), "B\n");
}

/// `numbered` lines of file `f{i}`: what the bump tests' upstream holds.
fn bump_file(i: usize, extra_top: usize) -> String {
    let mut text = String::new();
    for n in 0..extra_top {
        text.push_str(&format!("inserted {n}\n"));
    }
    for n in 1..=30 {
        text.push_str(&format!("f{i:02} line {n}\n"));
    }
    text
}

/// An upstream of 221 commits and a series of 25 patches (one per file): from commit 50 on,
/// patch 3 applies only with an offset; at commit 100, patch 7's change lands upstream; from
/// commit 160 on, patch 12 conflicts. Commits 1..220 otherwise touch another file.
fn bump_upstream(parent: &std::path::Path) -> (GitRepo, Vec<String>) {
    let repo = GitRepo::new(parent, "upstream");
    let mut files: Vec<(String, String)> = (1..=25)
        .map(|i| (format!("f{i:02}.txt"), bump_file(i, 0)))
        .collect();
    files.push(("log.txt".into(), String::new()));
    let mut commits = Vec::new();
    let first: Vec<(&str, &str)> = files
        .iter()
        .map(|(p, t)| (p.as_str(), t.as_str()))
        .collect();
    commits.push(repo.commit(&first, "commit 0"));
    let mut log = String::new();
    for k in 1..=220 {
        log.push_str(&format!("change {k}\n"));
        let mut changed = vec![("log.txt".to_string(), log.clone())];
        match k {
            50 => changed.push(("f03.txt".into(), bump_file(3, 3))),
            100 => changed.push((
                "f07.txt".into(),
                with_line(&bump_file(7, 0), 10, "f07 patched"),
            )),
            160 => changed.push((
                "f12.txt".into(),
                with_line(&bump_file(12, 0), 10, "f12 rewritten upstream"),
            )),
            _ => {}
        }
        let refs: Vec<(&str, &str)> = changed
            .iter()
            .map(|(p, t)| (p.as_str(), t.as_str()))
            .collect();
        commits.push(repo.commit(&refs, &format!("commit {k}")));
    }
    (repo, commits)
}

/// `bump --dry-run` picks exactly the newest commit where the series applies (commit 159)
/// in a handful of series checks, and writes nothing; `bump` then writes the pin (the
/// spec's rev stays the branch), drops the upstreamed patch from the series, refreshes the
/// offset one, and `check` passes at the new pin.
#[test]
fn bump_finds_the_newest_applying_commit_by_bisection_and_writes_it_all() {
    let parent = tempfile::tempdir().unwrap();
    let (repo, commits) = bump_upstream(parent.path());
    let project = project_on(&repo, &commits[0], "series");
    let mut series = String::new();
    for i in 1..=25 {
        let name = format!("{i:04}-f{i:02}.patch");
        let file = format!("f{i:02}.txt");
        let patch = line_patch_of(&file, &bump_file(i, 0), 10, &format!("f{i:02} patched"));
        project.write(&format!("patches/series/{name}"), &patch);
        series.push_str(&name);
        series.push('\n');
    }
    project.write("patches/series/series", &series);
    project.run(&["check", "app"]).success();
    let written = |project: &TestProject| {
        format!(
            "{}{}{}",
            walkdir_text(&project.root().join("patches")),
            project.read("pins/app.toml"),
            project.read("images/app/image.toml")
        )
    };
    let before = written(&project);

    let dry = project.run(&["--json", "bump", "app", "--dry-run"]);
    assert_eq!(dry.code(), 0, "{}", dry.stderr());
    let report: Value = serde_json::from_str(&dry.stdout()).unwrap();
    let bump = &report["bump"];
    assert_eq!(bump["candidates"], 220, "{report}");
    assert_eq!(bump["chosen"]["commit"], commits[159].as_str(), "{report}");
    let checks = bump["checks"].as_u64().unwrap();
    let bound = 2.0 * 220f64.log2() + 5.0;
    assert!((checks as f64) <= bound, "{checks} checks > {bound}");
    assert_eq!(bump["written"], false);
    let tried = report["tried"].as_array().unwrap();
    assert_eq!(tried.len() as u64, checks);
    let failing = tried.iter().find(|t| t["applies"] == false).unwrap();
    assert_eq!(failing["failing"][0], "series/0012-f12.patch", "{failing}");
    assert_eq!(written(&project), before, "--dry-run wrote something");

    // A pins file that cannot be written (immutable): bump fails after refreshing the series
    // (an upstream patch deleted), and every file is put back (the outside test found the
    // deleted patches gone and the series changed).
    struct Immutable(std::path::PathBuf);
    impl Drop for Immutable {
        fn drop(&mut self) {
            let _ = std::process::Command::new("chattr")
                .arg("-i")
                .arg(&self.0)
                .status();
        }
    }
    let pins_path = project.root().join("pins/app.toml");
    let locked = std::process::Command::new("chattr")
        .arg("+i")
        .arg(&pins_path)
        .status()
        .unwrap();
    assert!(
        locked.success(),
        "chattr +i: the test needs a file system with attributes"
    );
    let guard = Immutable(pins_path);
    let failed = project.run(&["bump", "app"]);
    assert_ne!(failed.code(), 0, "{}", failed.stderr());
    drop(guard);
    assert_eq!(
        written(&project),
        before,
        "a failed bump left files changed"
    );

    let bumped = project.run(&["bump", "app"]);
    assert_eq!(bumped.code(), 0, "{}", bumped.stderr());
    let pins = project.read("pins/app.toml");
    assert!(
        pins.contains(&format!("commit = \"{}\"", commits[159])),
        "{pins}"
    );
    assert!(
        project
            .read("images/app/image.toml")
            .contains("rev = \"main\"")
    );
    let series = project.read("patches/series/series");
    assert_eq!(series.lines().count(), 24, "{series}");
    assert!(!series.contains("0007-f07.patch"), "{series}");
    assert!(
        project
            .read("patches/series/0003-f03.patch")
            .contains("@@ -10,")
    );
    let checked = project.run(&["check", "app"]);
    assert_eq!(checked.code(), 0, "{}", checked.stderr());
    let again = project.run(&["--json", "patches", "report", "app"]);
    for (patch, status) in statuses(&document(&again.stdout())) {
        assert_eq!(status, "applies", "{patch}");
    }
}

/// A one-line patch of line `line` of `text` (file `file`), with three lines of context.
fn line_patch_of(file: &str, text: &str, line: usize, new: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let from = line.saturating_sub(3).max(1);
    let to = (line + 3).min(lines.len());
    let mut patch = format!(
        "--- a/{file}\n+++ b/{file}\n@@ -{from},{} +{from},{} @@\n",
        to - from + 1,
        to - from + 1
    );
    for n in from..=to {
        if n == line {
            patch.push_str(&format!("-{}\n+{new}\n", lines[n - 1]));
        } else {
            patch.push_str(&format!(" {}\n", lines[n - 1]));
        }
    }
    patch
}

/// `bump --build --bisect` on the testbed's builder: the newest commit applies the series
/// but a commit planted on the way breaks the image's smoke test. Bump names that commit and
/// leaves the one before it pinned (the series refreshed for it), and that image is built.
#[test]
fn bump_build_bisect_names_the_commit_that_broke_the_smoke_test() {
    let testbed = support::Testbed::get();
    let config = testbed.config();
    let run = support::unique();
    let parent = tempfile::tempdir().unwrap();
    let repo = GitRepo::new(parent.path(), "upstream");
    let mut commits = vec![repo.commit(&[("a.txt", &numbered("a", 10)), ("run.txt", &run)], "0")];
    for k in 1..=40 {
        let mut files = vec![("log.txt".to_string(), format!("{k}\n"))];
        if k == 25 {
            files.push(("broken".into(), "this breaks the smoke test\n".into()));
        }
        let refs: Vec<(&str, &str)> = files
            .iter()
            .map(|(p, t)| (p.as_str(), t.as_str()))
            .collect();
        commits.push(repo.commit(&refs, &format!("commit {k}")));
    }
    let project = project_on(&repo, &commits[0], "fix");
    project
        .write(
            "patches/fix/0001-a.patch",
            &line_patch_of("a.txt", &numbered("a", 10), 5, "a5 fixed"),
        )
        .write("patches/fix/series", "0001-a.patch\n");
    let image = project.read("images/app/image.toml").replace(
        "[from]\nref = \"example/base:1\"",
        "[from]\nref = \"hallmark-testbed/busybox:latest\"",
    );
    project.write(
        "images/app/image.toml",
        &format!(
            "[image]\nname = \"bisect-{run}\"\n\n{image}\n[[smoke]]\nname = \"not broken\"\nrun = [\"sh\", \"-c\", \"test ! -e /src/upstream/broken\"]\n"
        ),
    );
    let pins = project.read("pins/app.toml");
    let source = pins.split("[[source]]").nth(1).unwrap();
    project.write(
        "pins/app.toml",
        &format!("{}\n[[source]]{source}", crate::support::hello_pins()),
    );
    project
        .with_config(&config)
        .run(&["check", "app"])
        .success();

    let bumped = project
        .with_config(&config)
        .run(&["--json", "bump", "app", "--build", "--bisect"]);
    assert_eq!(bumped.code(), 1, "{}", bumped.stderr());
    let report: Value = serde_json::from_str(&bumped.stdout()).unwrap();
    let bump = &report["bump"];
    assert_eq!(bump["broken"]["commit"], commits[25].as_str(), "{report}");
    assert!(
        bump["broken"]["error"]
            .as_str()
            .unwrap()
            .contains("not broken"),
        "{report}"
    );
    assert_eq!(bump["chosen"]["commit"], commits[24].as_str(), "{report}");
    assert!(
        bumped.stderr().contains(&commits[25][..12]),
        "{}",
        bumped.stderr()
    );
    let pins = project.read("pins/app.toml");
    assert!(
        pins.contains(&format!("commit = \"{}\"", commits[24])),
        "{pins}"
    );
    project
        .with_config(&config)
        .run(&["check", "app"])
        .success();
    // The pinned image is the one built last: up to date, its smoke test passed.
    let again = project
        .with_config(&config)
        .run(&["--json", "build", "app"]);
    assert_eq!(again.code(), 0, "{}", again.stderr());
    assert!(again.stdout().contains("up-to-date"), "{}", again.stdout());
}

/// `after` names only the earlier patches a patch needs: the one whose change is in its
/// context, not another that changed the same file elsewhere (an outside test's real
/// series named 58 where 20 were needed).
#[test]
fn after_names_the_least_set_of_earlier_patches() {
    let parent = tempfile::tempdir().unwrap();
    let repo = GitRepo::new(parent.path(), "upstream");
    let text = numbered("a", 30);
    let commit = repo.commit(&[("a.txt", &text)], "first");
    let project = project_on(&repo, &commit, "set");
    let after_first = with_line(&text, 2, "a2 first");
    project
        .write(
            "patches/set/0001-first.patch",
            &line_patch_of("a.txt", &text, 2, "a2 first"),
        )
        .write(
            "patches/set/0002-far.patch",
            &line_patch_of("a.txt", &text, 20, "a20 far"),
        )
        .write(
            "patches/set/0003-next.patch",
            &line_patch_of("a.txt", &after_first, 3, "a3 next"),
        )
        .write(
            "patches/set/series",
            "0001-first.patch\n0002-far.patch\n0003-next.patch\n",
        );
    let reported = project.run(&["--json", "patches", "report", "app"]);
    assert_eq!(reported.code(), 0, "{}", reported.stderr());
    let report = document(&reported.stdout());
    assert_eq!(
        row(&report, "0003")["after"],
        serde_json::json!(["set/0001-first.patch"]),
        "{report}"
    );
    assert_eq!(
        row(&report, "0002")["after"],
        serde_json::json!([]),
        "{report}"
    );
}

/// A patch upstream in another form (its lines re-indented, two of them swapped, other
/// context around them) neither applies nor reverses: `upstream?`, with where its lines were
/// found, apart from a patch that really conflicts (it showed as `conflicts` like that one).
#[test]
fn a_patch_upstream_in_another_form_is_upstream_maybe_with_evidence() {
    let parent = tempfile::tempdir().unwrap();
    let repo = GitRepo::new(parent.path(), "upstream");
    let v1 =
        "def setup():\n    prepare()\n    return 0\n\n\ndef check():\n    a = 1\n    return a\n";
    let moved = "alpha = 1\nbeta = 2\ngamma = 3\ndelta = 4\n";
    let halved = "one = 1\ntwo = 2\nthree = 3\nfour = 4\n";
    let commit = repo.commit(
        &[
            ("app.py", v1),
            ("other.py", "x = 1\n"),
            ("mv.py", moved),
            ("rm.py", halved),
        ],
        "v1",
    );
    let project = project_on(&repo, &commit, "set");
    let adds = "--- a/app.py\n+++ b/app.py\n@@ -1,3 +1,5 @@\n def setup():\n     prepare()\n+    register_hooks(cache=True)\n+    load_plugins(strict=False)\n     return 0\n";
    let conflicts = support::one_line_patch("other.py", "x = 1", "x = 100");
    project
        .write("patches/set/0001-adds.patch", adds)
        .write("patches/set/0002-conflicts.patch", &conflicts)
        .write(
            "patches/set/0003-move.patch",
            "--- a/mv.py\n+++ b/mv.py\n@@ -1,4 +1,4 @@\n alpha = 1\n+gamma = 3\n beta = 2\n-gamma = 3\n delta = 4\n",
        )
        .write(
            "patches/set/0004-remove.patch",
            "--- a/rm.py\n+++ b/rm.py\n@@ -1,4 +1,2 @@\n one = 1\n-two = 2\n-three = 3\n four = 4\n",
        )
        .write(
            "patches/set/series",
            "0001-adds.patch\n0002-conflicts.patch\n0003-move.patch\n0004-remove.patch\n",
        );
    project.run(&["check", "app"]).success();
    // Upstream took the change its own way: tabs, the two calls swapped, a comment above.
    let v2 = "def setup():\n\t# hooks first\n\tprepare()\n\tload_plugins(strict=False)\n\tregister_hooks(cache=True)\n\treturn 0\n\n\ndef check():\n    a = 1\n    return a\n";
    repo.commit(
        &[
            ("app.py", v2),
            ("other.py", "x = 2\n"),
            ("mv.py", "alpha = 1\nbeta = 2\ngamma = 3\ndelta = 40\n"),
            ("rm.py", "one = 10\nthree = 3\nfour = 4\n"),
        ],
        "v2",
    );
    repo.git(&["tag", "v2"]);
    let reported = project.run(&["--json", "patches", "report", "app", "--rev", "v2"]);
    assert_eq!(reported.code(), 1, "{}", reported.stderr());
    let report = document(&reported.stdout());
    let maybe = row(&report, "0001");
    assert_eq!(maybe["status"], "upstream?", "{report}");
    assert!(
        maybe["evidence"]
            .as_str()
            .unwrap()
            .contains("app.py:4, reordered"),
        "{maybe}"
    );
    assert_eq!(row(&report, "0002")["status"], "conflicts", "{report}");
    // A move that is not upstream (the moved line is where it always was) and a removal
    // upstream did only half of: conflicts, not `upstream?` (an outside test saw both so).
    assert_eq!(row(&report, "0003")["status"], "conflicts", "{report}");
    assert_eq!(row(&report, "0004")["status"], "conflicts", "{report}");
    assert_eq!(row(&report, "0002")["evidence"], Value::Null, "{report}");
}

/// Issue 42: an mbox whose subjects git wrote in RFC 2047 encoded words (non-ASCII subjects,
/// long enough to fold) imports under the names `git format-patch` gives the same commits
/// as files: the subject decoded as git decodes it, not `UTF-8-q-...`.
#[test]
fn an_mbox_with_encoded_subjects_imports_under_format_patch_names() {
    let dir = tempfile::tempdir().unwrap();
    let repo = GitRepo::new(dir.path(), "tree");
    repo.commit(&[("base.txt", "base\n")], "base");
    repo.git(&["tag", "start"]);
    for (i, subject) in [
        "Füge die Übersetzung hinzu",
        "Ajoute la prise en charge des caractères accentués dans les noms de fichiers très longs",
    ]
    .iter()
    .enumerate()
    {
        let file = format!("f{i}.txt");
        repo.commit(&[(file.as_str(), "x\n")], subject);
    }
    let folder = dir.path().join("files");
    repo.git(&[
        "format-patch",
        "--quiet",
        "-o",
        folder.to_str().unwrap(),
        "start..main",
    ]);
    let mbox = repo.git(&["format-patch", "--stdout", "start..main"]);
    assert!(mbox.contains("=?UTF-8?q?"), "{mbox}");
    std::fs::write(dir.path().join("all.mbox"), format!("{mbox}\n")).unwrap();
    let project = TestProject::new();
    project
        .run(&["patches", "import", "from-folder", folder.to_str().unwrap()])
        .success();
    project
        .run(&[
            "patches",
            "import",
            "from-mbox",
            dir.path().join("all.mbox").to_str().unwrap(),
        ])
        .success();
    let series = project.read("patches/from-folder/series");
    assert!(
        series.starts_with("0001-F-ge-die-bersetzung-hinzu"),
        "{series}"
    );
    assert_eq!(project.read("patches/from-mbox/series"), series);
}
