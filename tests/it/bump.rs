//! `hallmark bump` of a git source on histories that are not monotone: a patch broken over a
//! window and whole again, a file deleted and added back, a change upstream that a patch
//! would repeat at an offset. Bump's answer must be a linear scan's, and every tool must
//! judge a patch alike.

use crate::support;

use serde_json::Value;
use support::{GitRepo, TestProject, document};

const BASE_DIGEST: &str = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

fn numbered(prefix: &str, lines: usize) -> String {
    (1..=lines)
        .map(|n| format!("{prefix} line {n}\n"))
        .collect()
}

fn with_line(text: &str, line: usize, new: &str) -> String {
    text.lines()
        .enumerate()
        .map(|(i, l)| format!("{}\n", if i + 1 == line { new } else { l }))
        .collect()
}

/// The diff git makes from `old` to `new` of `file` (function names in hunk headers).
fn diff_of(file: &str, old: &str, new: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("old"), old).unwrap();
    std::fs::write(dir.path().join("new"), new).unwrap();
    let out = std::process::Command::new("git")
        .args(["diff", "--no-index", "--no-prefix", "old", "new"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let body = &text[text.find("@@").unwrap()..];
    format!("--- a/{file}\n+++ b/{file}\n{body}")
}

pub(crate) fn project_on(repo: &GitRepo, commit: &str) -> TestProject {
    let project = TestProject::new();
    let url = repo.url();
    project
        .write(
            "images/app/image.toml",
            &format!(
                "[from]\nref = \"example/base:1\"\n\n[[source]]\nname = \"upstream\"\n\
                 git = \"{url}\"\nrev = \"main\"\ndest = \"/src/upstream\"\npatches = [\"s\"]\n"
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

const HELPER: &str = "def helper():\n    return \"helped\"\n";

fn module(top: bool) -> String {
    let mut text = String::from("import os\n\n");
    if top {
        text.push_str(HELPER);
        text.push('\n');
    }
    for n in 1..=12 {
        text.push_str(&format!("def f{n}():\n    return {n}\n\n"));
    }
    text
}

/// 220 commits after the pin. From 100 to 129 a context line of patch 1 is reworded (and
/// reworded back at 130); at 150 patch 2's file is deleted and at 170 added back as it was;
/// at 200 upstream takes patch 3's function (at the top of the file, so patch 3 still
/// applies, at an offset, next to nothing: it would define `helper` twice). Every other
/// commit touches a file no patch reads.
fn history(parent: &std::path::Path) -> (GitRepo, Vec<String>) {
    let repo = GitRepo::new(parent, "upstream");
    let a = numbered("a", 40);
    let b = numbered("b", 40);
    let mut commits = vec![repo.commit(
        &[
            ("a.txt", &a),
            ("b.txt", &b),
            ("m.py", &module(false)),
            ("log", ""),
        ],
        "commit 0",
    )];
    let mut log = String::new();
    for k in 1..=220 {
        log.push_str(&format!("change {k}\n"));
        let mut files: Vec<(&str, String)> = vec![("log", log.clone())];
        match k {
            100 => files.push(("a.txt", with_line(&a, 19, "a line 19 reworded"))),
            130 => files.push(("a.txt", a.clone())),
            150 => std::fs::remove_file(repo.path.join("b.txt")).unwrap(),
            170 => files.push(("b.txt", b.clone())),
            200 => files.push(("m.py", module(true))),
            _ => {}
        }
        let refs: Vec<(&str, &str)> = files.iter().map(|(p, t)| (*p, t.as_str())).collect();
        commits.push(repo.commit(&refs, &format!("commit {k}")));
    }
    (repo, commits)
}

fn write_series(project: &TestProject) {
    let a = numbered("a", 40);
    let b = numbered("b", 40);
    project.write(
        "patches/s/0001-a.patch",
        &diff_of("a.txt", &a, &with_line(&a, 20, "a patched")),
    );
    project.write(
        "patches/s/0002-b.patch",
        &diff_of("b.txt", &b, &with_line(&b, 20, "b patched")),
    );
    let helped = module(false).replacen(
        "def f6():\n    return 6\n\n",
        &format!("def f6():\n    return 6\n\n{HELPER}\n"),
        1,
    );
    project.write(
        "patches/s/0003-helper.patch",
        &diff_of("m.py", &module(false), &helped),
    );
    project.write(
        "patches/s/series",
        "0001-a.patch\n0002-b.patch\n0003-helper.patch\n",
    );
}

/// The newest of `commits` (oldest first) where `patches report --rev` passes: the answer
/// a person walking back from the newest by hand finds.
fn linear_scan(project: &TestProject, commits: &[String]) -> Option<String> {
    commits
        .iter()
        .rev()
        .find(|c| {
            project
                .run(&["patches", "report", "app", "--rev", c])
                .code()
                == 0
        })
        .cloned()
}

fn dry_run(project: &TestProject, args: &[&str]) -> Value {
    let mut all = vec!["--json", "bump", "app", "--dry-run"];
    all.extend(args);
    let run = project.run(&all);
    assert_eq!(run.code(), 0, "{}", run.stderr());
    serde_json::from_str(&run.stdout()).unwrap()
}

#[test]
fn bump_picks_what_a_linear_scan_picks_on_a_history_that_breaks_and_mends() {
    let parent = tempfile::tempdir().unwrap();
    let (repo, commits) = history(parent.path());
    let project = project_on(&repo, &commits[0]);
    write_series(&project);
    project.run(&["check", "app"]).success();

    // Up to 160: patch 1 broken over 100-129 and patch 2's file gone from 150: a bisection
    // that takes a failure to last lands in the window and pins 99.
    let to = commits[160].clone();
    let upto = dry_run(&project, &["--to", &to]);
    let linear = linear_scan(&project, &commits[1..=160]).unwrap();
    assert_eq!(linear, commits[149]);
    assert_eq!(upto["bump"]["chosen"]["commit"], linear.as_str(), "{upto}");
    // Change points at 100, 130, 150: four runs, and the checks only where needed.
    assert_eq!(upto["bump"]["runs"], 4, "{upto}");
    assert_eq!(upto["bump"]["checks"], 2, "{upto}");
    let tried = upto["tried"].as_array().unwrap();
    let covered: u64 = tried.iter().map(|t| t["covers"].as_u64().unwrap()).sum();
    assert_eq!(covered, 11 + 20, "{upto}");

    // The whole history: from 200 patch 3 would repeat upstream's `helper`: it is named
    // `upstream?`, and the newest revision before it is the answer.
    let all = dry_run(&project, &[]);
    let linear = linear_scan(&project, &commits[1..]).unwrap();
    assert_eq!(linear, commits[199]);
    assert_eq!(all["bump"]["chosen"]["commit"], linear.as_str(), "{all}");
    let newest = all["tried"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["through"] == commits[220][..12])
        .expect("the newest run was checked");
    assert_eq!(newest["applies"], false, "{newest}");
    assert_eq!(
        newest["upstream_maybe"][0], "s/0003-helper.patch",
        "{newest}"
    );
    let report = project.run(&["--json", "patches", "report", "app", "--rev", &commits[220]]);
    assert_eq!(report.code(), 1);
    let rows = document(&report.stdout());
    let helper = &rows[2];
    assert_eq!(helper["status"], "upstream?", "{rows}");
    assert!(
        helper["evidence"].as_str().unwrap().contains("m.py:"),
        "{rows}"
    );

    // The real run pins it, says why it went no further, and the tree defines helper once.
    let bumped = project.run(&["bump", "app"]);
    assert_eq!(bumped.code(), 0, "{}", bumped.stderr());
    assert!(
        bumped
            .stderr()
            .contains("s/0003-helper.patch may already be upstream"),
        "{}",
        bumped.stderr()
    );
    let pins = project.read("pins/app.toml");
    assert!(pins.contains(&commits[199]), "{pins}");
    project.run(&["check", "app"]).success();
    // At the new pin every patch applies as it is: `helper` is defined once.
    project.run(&["patches", "report", "app"]).success();
    // Bumping again goes no further: nothing newer applies (exit 1, the pin stays).
    let again = project.run(&["--json", "bump", "app", "--dry-run"]);
    assert_eq!(again.code(), 1, "{}", again.stderr());
    let again: Value = serde_json::from_str(&again.stdout()).unwrap();
    assert!(again["bump"]["chosen"].is_null(), "{again}");
}

/// What a tool made of one patch: taken (as is, or refreshed), dropped (upstream), or left
/// to a person.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Take,
    Drop,
    Person,
}

fn from_report(row: &Value) -> Verdict {
    match (row["status"].as_str().unwrap(), row["doubtful"].is_null()) {
        ("applies" | "offset" | "empty", true) => Verdict::Take,
        ("upstream", _) => Verdict::Drop,
        _ => Verdict::Person,
    }
}

/// Report, refresh, bump and check on a series of one patch at a time, each kind a patch
/// can be at a new upstream revision: they agree on every one.
#[test]
fn report_refresh_bump_and_check_judge_every_patch_alike() {
    let parent = tempfile::tempdir().unwrap();
    let repo = GitRepo::new(parent.path(), "upstream");
    let body = "{\n    int y = x;\n    int a = 0;\n    int b = 0;\n    y = y + 1;\n    y = y * 2;\n    return y + a + b;\n}\n";
    let dup = format!("int f1(int x)\n{body}\nint f2(int x)\n{body}");
    let text = numbered("t", 30);
    let files: Vec<(String, String)> = ["plain", "moved", "merged", "upstream", "changed", "edge"]
        .iter()
        .map(|n| (format!("{n}.txt"), text.clone()))
        .chain([
            ("dup.c".to_string(), dup.clone()),
            ("m.py".to_string(), module(false)),
        ])
        .collect();
    let refs: Vec<(&str, &str)> = files
        .iter()
        .map(|(p, t)| (p.as_str(), t.as_str()))
        .collect();
    let pin = repo.commit(&refs, "pin");
    let helped = module(false).replacen(
        "def f6():\n    return 6\n\n",
        &format!("def f6():\n    return 6\n\n{HELPER}\n"),
        1,
    );
    let patches: Vec<(&str, String, Verdict)> = vec![
        (
            "plain",
            diff_of("plain.txt", &text, &with_line(&text, 15, "p")),
            Verdict::Take,
        ),
        (
            "moved",
            diff_of("moved.txt", &text, &with_line(&text, 15, "p")),
            Verdict::Take,
        ),
        (
            "upstream",
            diff_of("upstream.txt", &text, &with_line(&text, 15, "p")),
            Verdict::Drop,
        ),
        (
            "changed",
            diff_of("changed.txt", &text, &with_line(&text, 15, "p")),
            Verdict::Person,
        ),
        (
            "edge",
            diff_of("edge.txt", &text, &with_line(&text, 15, "p")),
            Verdict::Person,
        ),
        (
            "dup",
            diff_of(
                "dup.c",
                &dup,
                &dup.replacen("y = y + 1;", "y = y + 100;", 1),
            ),
            Verdict::Person,
        ),
        (
            "helper",
            diff_of("m.py", &module(false), &helped),
            Verdict::Person,
        ),
    ];
    // The new revision: lines on top (an offset), the change taken upstream, the changed
    // line rewritten (a conflict), a context line at the hunk's edge changed (fuzz), f1
    // rewritten (dup's hunk lands in f2), `helper` added at the top.
    let top = format!("new 1\nnew 2\n{text}");
    let dup_v2 =
        format!("/* a */\n/* b */\nint f1(int x)\n{{\n    return x;\n}}\n\nint f2(int x)\n{body}");
    let v2 = repo.commit(
        &[
            ("moved.txt", &top),
            ("upstream.txt", &with_line(&text, 15, "p")),
            ("changed.txt", &with_line(&text, 15, "rewritten")),
            ("edge.txt", &with_line(&text, 12, "edge moved")),
            ("dup.c", &dup_v2),
            ("m.py", &module(true)),
        ],
        "v2",
    );
    for (name, patch, expected) in patches {
        let project = project_on(&repo, &pin);
        project.write(&format!("patches/s/{name}.patch"), &patch);
        project.write("patches/s/series", &format!("{name}.patch\n"));
        let report = project.run(&["--json", "patches", "report", "app", "--rev", &v2]);
        let reported = from_report(&document(&report.stdout())[0]);
        assert_eq!(reported, expected, "{name}: report {}", report.stdout());
        assert_eq!(
            report.code() == 0,
            reported == Verdict::Take,
            "{name}: report's exit"
        );

        let bumped = project.run(&["--json", "bump", "app", "--dry-run"]);
        assert!(bumped.code() < 2, "{name}: {}", bumped.stderr());
        let doc: Value = serde_json::from_str(&bumped.stdout()).unwrap();
        let row = &doc["tried"][0];
        let by_bump = match (
            row["applies"].as_bool().unwrap(),
            row["statuses"]["upstream"].is_null(),
        ) {
            (false, _) => Verdict::Person,
            (true, false) => Verdict::Drop,
            (true, true) => Verdict::Take,
        };
        assert_eq!(by_bump, expected, "{name}: bump {doc}");
        assert_eq!(
            doc["bump"]["chosen"].is_null(),
            expected == Verdict::Person,
            "{name}"
        );

        let refreshed = project.run(&["patches", "refresh", "app", "--rev", &v2]);
        let said = refreshed.stderr();
        let by_refresh = if said.contains(&format!("dropped s/{name}.patch")) {
            Verdict::Drop
        } else if said.contains("untouched") || said.contains("nothing rewritten") {
            Verdict::Person
        } else {
            Verdict::Take
        };
        assert_eq!(by_refresh, expected, "{name}: refresh {said}");
        assert_eq!(
            refreshed.code() == 0,
            expected != Verdict::Person,
            "{name}: refresh's exit"
        );

        // At the new revision as the pin (the series as it was): check and report agree.
        let moved = project_on(&repo, &v2);
        moved.write(&format!("patches/s/{name}.patch"), &patch);
        moved.write("patches/s/series", &format!("{name}.patch\n"));
        let checked = moved.run(&["check", "app"]);
        let at_pin = moved.run(&["patches", "report", "app"]);
        assert_eq!(
            checked.code() == 0,
            at_pin.code() == 0,
            "{name}: check {} / report {}",
            checked.stderr(),
            at_pin.stdout()
        );
    }
}

/// An upstream of `n` commits after commit 0 (a.txt of 20 lines, log noise), `at(k)` giving
/// more files for commit k.
pub(crate) fn simple_history(
    parent: &std::path::Path,
    n: usize,
    at: impl Fn(usize) -> Vec<(String, String)>,
) -> (GitRepo, Vec<String>) {
    let repo = GitRepo::new(parent, "upstream");
    let mut commits = vec![repo.commit(&[("a.txt", &numbered("a", 20)), ("log", "")], "0")];
    for k in 1..=n {
        let mut files = vec![("log".to_string(), format!("{k}\n"))];
        files.extend(at(k));
        let refs: Vec<(&str, &str)> = files
            .iter()
            .map(|(p, t)| (p.as_str(), t.as_str()))
            .collect();
        commits.push(repo.commit(&refs, &format!("commit {k}")));
    }
    (repo, commits)
}

pub(crate) fn a_patch(project: &TestProject) {
    let a = numbered("a", 20);
    project
        .write(
            "patches/s/0001-a.patch",
            &diff_of("a.txt", &a, &with_line(&a, 10, "a patched")),
        )
        .write("patches/s/series", "0001-a.patch\n");
}

/// Tags: only those matching the glob now count (a run with another glob before leaves its
/// tags out), a glob matching nothing exits 1 saying so, glob characters are matched by
/// hallmark; `--to` off the first-parent line, a branch that is not there and a `--to` that
/// names nothing are input errors (exit 2); when every patch went upstream bump leaves an
/// empty series, which `check` takes, as the dry run said.
#[test]
fn bump_edges_tags_globs_to_branch_and_an_empty_series() {
    let parent = tempfile::tempdir().unwrap();
    let (repo, commits) = simple_history(parent.path(), 6, |_| Vec::new());
    repo.git(&["tag", "v1.0", &commits[2]]);
    repo.git(&["tag", "v1.1", &commits[4]]);
    repo.git(&["tag", "nightly-6", &commits[6]]);
    let project = project_on(&repo, &commits[0]);
    a_patch(&project);

    let nightly = dry_run(&project, &["--tags", "nightly-*"]);
    assert_eq!(nightly["bump"]["chosen"]["tag"], "nightly-6", "{nightly}");
    let versions = dry_run(&project, &["--tags", "v1.[0-9]"]);
    assert_eq!(versions["bump"]["candidates"], 2, "{versions}");
    assert_eq!(versions["bump"]["chosen"]["tag"], "v1.1", "{versions}");
    let none = project.run(&["bump", "app", "--tags", "v9*", "--dry-run"]);
    assert_eq!(none.code(), 1, "{}", none.stderr());
    assert!(
        none.stderr().contains("no tag of") && none.stderr().contains("`v9*`"),
        "{}",
        none.stderr()
    );

    // A side branch merged into main: its commit is an ancestor of main, not on its line.
    repo.git(&["checkout", "-q", "-b", "side", &commits[6]]);
    let side = repo.commit(&[("side.txt", "side\n")], "side");
    repo.git(&["checkout", "-q", "main"]);
    repo.git(&["merge", "-q", "--no-ff", "-m", "merge side", "side"]);
    let off = project.run(&["bump", "app", "--to", &side, "--dry-run"]);
    assert_eq!(off.code(), 2, "{}", off.stderr());
    assert!(off.stderr().contains("first-parent"), "{}", off.stderr());
    let branch = project.run(&["bump", "app", "--branch", "no-such", "--dry-run"]);
    assert_eq!(branch.code(), 2, "{}", branch.stderr());
    assert!(
        branch.stderr().contains("no branch `no-such`"),
        "{}",
        branch.stderr()
    );
    let to = project.run(&["bump", "app", "--to", "no-such-rev", "--dry-run"]);
    assert_eq!(to.code(), 2, "{}", to.stderr());
    assert!(to.stderr().contains("names no commit"), "{}", to.stderr());

    // Upstream takes the patch: the series goes empty, and stays a set check accepts.
    let a = numbered("a", 20);
    let taken = repo.commit(&[("a.txt", &with_line(&a, 10, "a patched"))], "upstream");
    let dry = dry_run(&project, &[]);
    assert_eq!(dry["bump"]["chosen"]["commit"], taken.as_str(), "{dry}");
    let bumped = project.run(&["bump", "app"]);
    assert_eq!(bumped.code(), 0, "{}", bumped.stderr());
    let series = project.read("patches/s/series");
    assert!(
        series
            .lines()
            .all(|l| l.trim().is_empty() || l.starts_with('#')),
        "{series}"
    );
    assert!(!project.root().join("patches/s/0001-a.patch").exists());
    project.run(&["check", "app"]).success();
}

/// Two bumps of one project at once, 20 times: the second waits for the first and finds
/// nothing newer; the files end as one bump leaves them (the offset patch refreshed), never
/// one bump's work undone by the other.
#[test]
fn two_bumps_at_once_take_turns() {
    let parent = tempfile::tempdir().unwrap();
    // From commit 7, a.txt has a line on top: the patch applies at an offset, refreshed.
    let (repo, commits) = simple_history(parent.path(), 10, |k| match k {
        7 => vec![("a.txt".into(), format!("top\n{}", numbered("a", 20)))],
        _ => Vec::new(),
    });
    for round in 0..20 {
        let project = project_on(&repo, &commits[0]);
        a_patch(&project);
        let bump = || {
            support::hallmark()
                .args(["bump", "app"])
                .current_dir(project.root())
                .env("HALLMARK_CACHE", project.root().join(".test-cache"))
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        };
        let (first, second) = (bump(), bump());
        let outputs = [
            first.wait_with_output().unwrap(),
            second.wait_with_output().unwrap(),
        ];
        for output in &outputs {
            assert_eq!(
                output.status.code(),
                Some(0),
                "round {round}: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        let said: String = outputs
            .iter()
            .map(|o| String::from_utf8_lossy(&o.stderr).to_string())
            .collect();
        assert!(said.contains("nothing to do"), "round {round}: {said}");
        let pins = project.read("pins/app.toml");
        assert!(pins.contains(&commits[10]), "round {round}: {pins}");
        let patch = project.read("patches/s/0001-a.patch");
        assert!(
            patch.contains("@@ -8,7 +8,7 @@"),
            "round {round}: refreshed at the offset: {patch}"
        );
        project.run(&["check", "app"]).success();
    }
}

/// A project whose image copies the source onto the testbed's busybox and smoke-tests it with
/// `smoke` (a shell line run in /src/upstream).
fn built_project(repo: &GitRepo, pin: &str, run: &str, smoke: &str) -> TestProject {
    let project = project_on(repo, pin);
    a_patch(&project);
    let image = project.read("images/app/image.toml").replace(
        "[from]\nref = \"example/base:1\"",
        "[from]\nref = \"hallmark-testbed/busybox:latest\"",
    );
    project.write(
        "images/app/image.toml",
        &format!(
            "[image]\nname = \"bump-{run}\"\n\n{image}\n[[smoke]]\nname = \"tree\"\nrun = [\"sh\", \"-c\", \"cd /src/upstream && {smoke}\"]\n"
        ),
    );
    let pins = project.read("pins/app.toml");
    let source = pins.split("[[source]]").nth(1).unwrap();
    project.write(
        "pins/app.toml",
        &format!("{}\n[[source]]{source}", crate::support::hello_pins()),
    );
    project
}

/// `--build --bisect` over a history where the series does not apply for a while (commits
/// 8-11): bisection steps over those candidates to the nearest it can build (it exited 2
/// with a `--force` hint bump does not have), and names commit 15, which broke the smoke
/// test, pinning 14.
#[test]
fn bump_bisect_steps_over_candidates_where_the_series_does_not_apply() {
    let testbed = support::Testbed::get();
    let config = testbed.config();
    let run = support::unique();
    let parent = tempfile::tempdir().unwrap();
    let a = numbered("a", 20);
    let (repo, commits) = simple_history(parent.path(), 20, |k| match k {
        8 => vec![("a.txt".into(), with_line(&a, 9, "a line 9 reworded"))],
        12 => vec![("a.txt".into(), a.clone())],
        15 => vec![("broken".into(), "this breaks the smoke test\n".into())],
        _ => Vec::new(),
    });
    let project = built_project(&repo, &commits[0], &run, "test ! -e broken");
    project
        .with_config(&config)
        .run(&["check", "app"])
        .success();
    let bumped = project
        .with_config(&config)
        .run(&["--json", "bump", "app", "--build", "--bisect"]);
    assert_eq!(bumped.code(), 1, "{}", bumped.stderr());
    let report: Value = serde_json::from_str(&bumped.stdout()).unwrap();
    assert_eq!(
        report["bump"]["broken"]["commit"],
        commits[15].as_str(),
        "{report}"
    );
    assert_eq!(
        report["bump"]["chosen"]["commit"],
        commits[14].as_str(),
        "{report}"
    );
    let pins = project.read("pins/app.toml");
    assert!(pins.contains(&commits[14]), "{pins}");
    project
        .with_config(&config)
        .run(&["check", "app"])
        .success();
}

/// SIGTERM while `--build --bisect` builds a candidate (its smoke test hangs): bump ends as
/// interrupted (130), not as that commit's failure, with the spec, pins and series as they
/// were and no smoke container left.
#[test]
fn a_sigterm_during_a_bisect_build_leaves_every_file_as_it_was() {
    let testbed = support::Testbed::get();
    let config = testbed.config();
    let run = support::unique();
    let parent = tempfile::tempdir().unwrap();
    let (repo, commits) = simple_history(parent.path(), 20, |k| match k {
        // Bisection's first build after the newest is commit 10 (candidate 9 of 0..=19).
        1 | 11 => vec![("hang".into(), "no\n".into())],
        10 => vec![("hang".into(), "yes\n".into())],
        15 => vec![("broken".into(), "this breaks the smoke test\n".into())],
        _ => Vec::new(),
    });
    let project = built_project(
        &repo,
        &commits[0],
        &run,
        &format!("echo {run}; if grep -q yes hang; then sleep 600; fi; test ! -e broken"),
    );
    project
        .with_config(&config)
        .run(&["check", "app"])
        .success();
    let files = |project: &TestProject| {
        format!(
            "{}{}{}{}",
            project.read("images/app/image.toml"),
            project.read("pins/app.toml"),
            project.read("patches/s/series"),
            project.read("patches/s/0001-a.patch")
        )
    };
    let before = files(&project);
    let mut child = support::spawn(&project, &config, &["bump", "app", "--build", "--bisect"]);
    // The hanging smoke test: a running container of this run (its command names it) whose
    // processes are at `sleep 600` (every candidate's smoke test names the run; only the
    // hanging one sleeps).
    let hanging = || {
        let listed = testbed.docker_ok(
            "builder",
            &[
                "ps",
                "--no-trunc",
                "--filter",
                "status=running",
                "--format",
                "{{.ID}} {{.Command}}",
            ],
        );
        listed
            .lines()
            .filter(|l| l.contains(&run))
            .filter_map(|l| l.split_whitespace().next())
            .any(|id| {
                // A container that ended meanwhile answers nothing.
                let top = testbed.docker("builder", &["top", id]);
                String::from_utf8_lossy(&top.stdout).contains("sleep 600")
            })
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    while !hanging() && child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let output = child.wait_with_output().unwrap();
            panic!(
                "no hanging smoke test: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    if child.try_wait().unwrap().is_some() {
        let output = child.wait_with_output().unwrap();
        panic!(
            "bump ended before the hang: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    support::wait_for("bump to end after SIGTERM", || {
        child.try_wait().unwrap().is_some()
    });
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(130), "{stderr}");
    assert!(!stderr.contains("broke the build"), "{stderr}");
    assert_eq!(files(&project), before, "{stderr}");
    assert!(!hanging(), "the smoke container was left running");
}

/// Two projects on one upstream and one source cache, fetching at once: they take turns on
/// the cache repository (they collided on git's `shallow.lock` and one failed).
#[test]
fn two_fetches_into_one_cache_repository_take_turns() {
    let parent = tempfile::tempdir().unwrap();
    let (repo, commits) = simple_history(parent.path(), 3, |_| Vec::new());
    for round in 0..20 {
        let cache = tempfile::tempdir().unwrap();
        let projects = [
            project_on(&repo, &commits[1]),
            project_on(&repo, &commits[2]),
        ];
        let reports: Vec<_> = projects
            .iter()
            .map(|project| {
                a_patch(project);
                support::hallmark()
                    .args(["patches", "report", "app"])
                    .current_dir(project.root())
                    .env("HALLMARK_CACHE", cache.path())
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for report in reports {
            let output = report.wait_with_output().unwrap();
            assert_eq!(
                output.status.code(),
                Some(0),
                "round {round}: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
    }
}
