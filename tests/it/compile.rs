//! Compile stages on a real builder: a C extension compiled from a patched git source in a
//! container of the testbed's toolchain image, its wheel assembled into an image of a parent
//! with no compiler; caches in named volumes; failures, interrupts, reproducibility.

use crate::support;

use support::{GitRepo, TestProject, Testbed, one_line_patch, unique};

const SETUP_PY: &str = r#"from setuptools import setup, Extension
setup(name="hmext", version="0.1.0", ext_modules=[Extension("hmext", ["hmext.c", "other.c"])])
"#;

const HMEXT_C: &str = r#"#include <Python.h>
#include "value.h"
long other(void);
static PyObject *value(PyObject *self, PyObject *args) { return PyLong_FromLong(HM_VALUE + other()); }
static PyMethodDef methods[] = {{"value", value, METH_NOARGS, "value"}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "hmext", NULL, -1, methods};
PyMODINIT_FUNC PyInit_hmext(void) { return PyModule_Create(&module); }
"#;

/// A C extension in a git repository, a patch series changing one line of a C header, and a
/// spec compiling it with the testbed's toolchain into an image of the plain Python base.
/// `stage` is appended to the `[[compile]]` table (more keys), `rest` to the spec.
struct CompileProject {
    project: TestProject,
    name: String,
    cache: String,
}

impl CompileProject {
    fn new(run_steps: &str, rest: &str) -> CompileProject {
        let project = TestProject::new();
        let run = unique();
        let upstream = GitRepo::new(project.root(), "upstream");
        upstream.commit(
            &[
                ("setup.py", SETUP_PY),
                ("hmext.c", HMEXT_C),
                ("other.c", "long other(void) { return 100; }\n"),
                ("value.h", "#define HM_VALUE 1\n"),
            ],
            "hmext",
        );
        let name = format!("cext-{run}");
        let cache = format!("ccache-{run}");
        project
            .write(
                "images/cext/image.toml",
                &format!(
                    r#"[image]
name = "{name}"

[from]
ref = "hallmark-testbed/python:bookworm"

[[source]]
name = "hmext"
git = "{url}"
rev = "main"
dest = "/src/hmext"
patches = ["value"]

[[compile]]
name = "hmext"
sources = ["hmext"]
toolchain = "hallmark-testbed/toolchain:bookworm"
run = [{run_steps}]
wheels = ["hmext"]

[compile.args]
CC = "ccache gcc"
CCACHE_DIR = "/cache/ccache"
CCACHE_BASEDIR = "/src"
CCACHE_NOHASHDIR = "1"

[compile.caches.{cache}]
path = "/cache/ccache"
cap = "100M"

[env]
MARKER = "one"
{rest}"#,
                    url = upstream.url()
                ),
            )
            .write("patches/value/series", "0001-value.patch\n")
            .write(
                "patches/value/0001-value.patch",
                &one_line_patch("value.h", "#define HM_VALUE 1", "#define HM_VALUE 41"),
            );
        let compile = CompileProject {
            project,
            name,
            cache,
        };
        compile.hallmark(&["lock", "cext"]).success();
        compile
    }

    fn hallmark(&self, args: &[&str]) -> support::Run {
        self.project.with_config(Testbed::get().config()).run(args)
    }

    fn edit(&self, from: &str, to: &str) {
        let text = self.project.read("images/cext/image.toml");
        assert!(text.contains(from), "{text}");
        self.project
            .write("images/cext/image.toml", &text.replace(from, to));
    }

    /// The containers created on the builder for this image since `since` (unix seconds),
    /// from the engine's own event log: removed ones count.
    fn containers_created_since(&self, since: &str) -> usize {
        let filter = format!("label=hallmark.compile.image={}:latest", self.name);
        created_since(since, &filter, "{{.ID}}").len()
    }

    fn leftover_containers(&self) -> String {
        let filter = format!("label=hallmark.compile.image={}:latest", self.name);
        Testbed::get().docker_ok("builder", &["ps", "-aq", "--filter", &filter])
    }

    fn volume(&self) -> String {
        format!("hallmark-cache-{}", self.cache)
    }

    /// Regular files in the cache volume.
    fn cached_files(&self) -> usize {
        let mount = format!("{}:/c", self.volume());
        let listed = Testbed::get().docker_ok(
            "builder",
            &[
                "run",
                "--rm",
                "--network",
                "none",
                "-v",
                &mount,
                "hallmark-testbed/toolchain:bookworm",
                "find",
                "/c",
                "-type",
                "f",
            ],
        );
        listed.lines().filter(|l| !l.trim().is_empty()).count()
    }
}

impl Drop for CompileProject {
    fn drop(&mut self) {
        let _ = Testbed::get().docker("builder", &["volume", "rm", "-f", &self.volume()]);
    }
}

/// One line (in `format`) per container created on the builder since `since` (unix seconds)
/// that matches `filter`, from the engine's own event log: removed containers count.
fn created_since(since: &str, filter: &str, format: &str) -> Vec<String> {
    let until = (now().parse::<u64>().unwrap() + 1).to_string();
    let events = Testbed::get().docker_ok(
        "builder",
        &[
            "events",
            "--since",
            since,
            "--until",
            &until,
            "--filter",
            "type=container",
            "--filter",
            "event=create",
            "--filter",
            filter,
            "--format",
            format,
        ],
    );
    events
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_string)
        .collect()
}

fn now() -> String {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        .to_string()
}

const WHEEL_STEP: &str = r#""cd /src/hmext && python3 -m pip wheel --no-deps --no-build-isolation -w $HALLMARK_WHEELS .""#;

#[test]
fn a_compile_stage_builds_its_wheel_into_the_image_and_an_env_change_runs_no_container() {
    let testbed = Testbed::get();
    let compile = CompileProject::new(WHEEL_STEP, "");
    let reference = format!("{}:latest", compile.name);

    let since = now();
    let built = compile
        .hallmark(&["--json", "build", "cext"])
        .success()
        .stdout();
    let records = support::document(&built);
    assert_eq!(records[0]["outcome"], "assembled", "{built}");
    assert_eq!(compile.containers_created_since(&since), 1);
    assert_eq!(compile.leftover_containers(), "");

    // The patched extension imports; pip sees one distribution with its files; no compiler.
    let value = testbed.run_container(
        "builder",
        &reference,
        &["python3", "-c", "import hmext; print(hmext.value())"],
    );
    assert_eq!(value, "141");
    let shown = testbed.run_container(
        "builder",
        &reference,
        &["python3", "-m", "pip", "show", "-f", "hmext"],
    );
    assert!(shown.contains("Version: 0.1.0"), "{shown}");
    assert!(shown.contains("hmext.cpython-311-"), "{shown}");
    testbed.run_container("builder", &reference, &["python3", "-m", "pip", "check"]);
    let compiler = testbed.run_container(
        "builder",
        &reference,
        &["sh", "-c", "command -v gcc ccache || echo none"],
    );
    assert_eq!(compiler, "none");

    // Only the image's env changes: assembled again from the kept wheel, no compile container.
    compile.edit("MARKER = \"one\"", "MARKER = \"two\"");
    let since = now();
    let rebuilt = compile.hallmark(&["build", "cext"]);
    rebuilt.success();
    assert!(
        rebuilt.stderr().contains("no container"),
        "{}",
        rebuilt.stderr()
    );
    assert_eq!(compile.containers_created_since(&since), 0);
    let marker = testbed.run_container("builder", &reference, &["sh", "-c", "echo $MARKER"]);
    assert_eq!(marker, "two");

    // `--force` compiles again (the kept wheels were used for good: an outside test found
    // nothing short of emptying the store recompiled a stage), and the image still works.
    let since = now();
    let forced = compile.hallmark(&["build", "--force", "cext"]);
    forced.success();
    assert!(
        forced.stderr().contains("compiled in"),
        "{}",
        forced.stderr()
    );
    assert!(compile.containers_created_since(&since) > 0);
    let value = testbed.run_container(
        "builder",
        &reference,
        &["python3", "-c", "import hmext; print(hmext.value())"],
    );
    assert_eq!(value, "141");
}

#[test]
fn a_failing_compile_command_is_named_with_its_last_lines() {
    let compile = CompileProject::new(
        r#""echo first step fine", "echo LAST-WORDS-OF-THE-COMPILER >&2; exit 3""#,
        "",
    );
    let failed = compile.hallmark(&["build", "cext"]);
    assert_eq!(failed.code(), 1, "{}", failed.stderr());
    let stderr = failed.stderr();
    assert!(
        stderr.contains("compile stage `hmext`, command 2 of 2"),
        "{stderr}"
    );
    assert!(stderr.contains("exit code 3"), "{stderr}");
    assert!(stderr.contains("LAST-WORDS-OF-THE-COMPILER"), "{stderr}");
    assert_eq!(compile.leftover_containers(), "");
}

#[test]
fn a_stage_that_leaves_no_wheel_of_its_distribution_fails_naming_it() {
    let compile = CompileProject::new(r#""touch $HALLMARK_WHEELS/notes.txt""#, "");
    let failed = compile.hallmark(&["build", "cext"]);
    assert_eq!(failed.code(), 1, "{}", failed.stderr());
    assert!(
        failed.stderr().contains("left no wheel of `hmext`"),
        "{}",
        failed.stderr()
    );
}

#[test]
fn ctrl_c_during_a_compile_removes_its_container() {
    let testbed = Testbed::get();
    let compile = CompileProject::new(r#""echo compiling; sleep 600""#, "");
    let child = support::spawn(&compile.project, &testbed.config(), &["build", "cext"]);
    let filter = format!("label=hallmark.compile.image={}:latest", compile.name);
    support::wait_for("the compile container running", || {
        !testbed
            .docker_ok(
                "builder",
                &[
                    "ps",
                    "-q",
                    "--filter",
                    &filter,
                    "--filter",
                    "status=running",
                ],
            )
            .is_empty()
    });
    let pid = child.id().to_string();
    assert!(
        std::process::Command::new("kill")
            .args(["-INT", &pid])
            .status()
            .unwrap()
            .success()
    );
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(130), "{stderr}");
    assert_eq!(compile.leftover_containers(), "");
}

#[test]
fn compile_caches_survive_builds_and_prune_caps_them() {
    let compile = CompileProject::new(
        &format!(
            "{WHEEL_STEP}, \"ccache --print-stats | grep -E '^(direct|preprocessed)_cache_hit'\""
        ),
        "",
    );
    compile.hallmark(&["build", "cext"]).success();
    let first = compile.cached_files();
    assert!(first > 0, "the compile left nothing in its cache");
    let stage_checksum = || {
        let rendered = compile.hallmark(&["render", "cext"]).success().stdout();
        let at = rendered.find("(stage checksum ").unwrap() + "(stage checksum ".len();
        rendered[at..at + 64].to_string()
    };
    let compiled = compile.project.root().join(".test-cache/store/compiled");
    let old_stage = stage_checksum();
    assert!(compiled.join(&old_stage).is_dir());

    // A one-line change of the header through the patch series: hmext.c is compiled again,
    // other.c comes from the cache the first build filled.
    compile.project.write(
        "patches/value/0001-value.patch",
        &one_line_patch("value.h", "#define HM_VALUE 1", "#define HM_VALUE 42"),
    );
    compile.hallmark(&["build", "cext"]).success();
    let logs = compile.project.root().join(".hallmark/logs");
    let hits: u64 = std::fs::read_dir(&logs)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains("-compile-hmext-"))
        .map(|e| std::fs::read_to_string(e.path()).unwrap())
        .flat_map(|log| {
            log.lines()
                .filter(|l| l.ends_with("cache_hit") || l.contains("_cache_hit\t"))
                .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .collect::<Vec<_>>()
        })
        .sum();
    assert!(hits >= 1, "no cache hit in the second compile's log");

    let listed = compile.hallmark(&["--json", "caches"]).success().stdout();
    let rows = support::document(&listed);
    let row = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["volume"] == compile.volume().as_str())
        .unwrap_or_else(|| panic!("{listed}"));
    assert_eq!(row["cap"], 100 * 1024 * 1024);
    assert!(row["size"].as_u64().unwrap() > 0, "{listed}");

    // A cap below what the cache holds: prune trims it, the oldest files first. The wheels
    // kept for the stage before the change go (no spec has that stage now), the current
    // stage's stay.
    compile.edit("cap = \"100M\"", "cap = \"1K\"");
    let new_stage = stage_checksum();
    assert_ne!(new_stage, old_stage);
    let pruned = compile.hallmark(&["prune"]).success().stderr();
    assert_eq!(compile.cached_files(), 0);
    assert!(!compiled.join(&old_stage).exists(), "{pruned}");
    assert!(compiled.join(&new_stage).is_dir(), "{pruned}");
    assert!(
        pruned.contains("the wheels of 1 compile stages"),
        "{pruned}"
    );
}

#[test]
fn a_warm_and_an_empty_cache_compile_give_the_same_image_and_check_repro_passes() {
    let testbed = Testbed::get();
    let compile = CompileProject::new(WHEEL_STEP, "");
    let reference = format!("{}:latest", compile.name);
    let build_with_store = |store: &str| {
        let config = testbed.config();
        let output = support::hallmark_at(&config)
            .args(["build", "--force", "cext"])
            .current_dir(compile.project.root())
            .env("HALLMARK_CACHE", compile.project.root().join(store))
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        testbed.image_id("builder", &reference)
    };
    // Empty cache volume and empty layer store: compiled cold.
    let cold = build_with_store(".store-cold");
    assert!(compile.cached_files() > 0);
    // Another empty layer store: compiled again, now with the warm cache volume.
    let warm = build_with_store(".store-warm");
    assert_eq!(cold, warm, "a warm cache gave another image");

    let checked = compile.hallmark(&["build", "--check-repro", "cext"]);
    assert_eq!(checked.code(), 0, "{}", checked.stderr());
    assert!(
        checked.stderr().contains("reproducible"),
        "{}",
        checked.stderr()
    );
}

/// Issue 16 item 1: the parent already has the distribution installed (as the vllm-openai
/// base ships vLLM). The assembled layer replaces it as pip would: the old RECORD's files are
/// gone (whiteouts), one dist-info remains, `pip show` and `pip check` agree.
#[test]
fn a_compiled_wheel_replaces_the_distribution_the_parent_has_installed() {
    let testbed = Testbed::get();
    let project = TestProject::new();
    let run = unique();
    let upstream = GitRepo::new(project.root(), "upstream");
    let old = upstream.commit(
        &[
            (
                "setup.py",
                "from setuptools import setup, Extension\nsetup(name=\"hmext\", version=\"0.1.0\", py_modules=[\"hmold\"], ext_modules=[Extension(\"hmext\", [\"hmext.c\", \"other.c\"])])\n",
            ),
            ("hmold.py", "OLD = True\n"),
            ("hmext.c", HMEXT_C),
            ("other.c", "long other(void) { return 100; }\n"),
            ("value.h", "#define HM_VALUE 1\n"),
        ],
        "0.1.0",
    );
    upstream.git(&["rm", "--quiet", "hmold.py"]);
    let new = upstream.commit(
        &[
            ("setup.py", SETUP_PY.replace("0.1.0", "0.2.0").as_str()),
            ("value.h", "#define HM_VALUE 2\n"),
        ],
        "0.2.0",
    );
    let spec = |name: &str, from: &str, rev: &str| {
        format!(
            r#"[image]
name = "{name}-{run}"

[from]
{from}

[[source]]
name = "hmext"
git = "{url}"
rev = "{rev}"
dest = "/src/hmext"

[[compile]]
name = "hmext"
sources = ["hmext"]
toolchain = "hallmark-testbed/toolchain:bookworm"
run = [{WHEEL_STEP}]
wheels = ["hmext"]
"#,
            url = upstream.url()
        )
    };
    project
        .write(
            "images/old/image.toml",
            &spec("old", "ref = \"hallmark-testbed/python:bookworm\"", &old),
        )
        .write(
            "images/new/image.toml",
            &spec("new", "image = \"old\"", &new),
        );
    let config = testbed.config();
    project.with_config(&config).run(&["lock"]).success();
    project
        .with_config(&config)
        .run(&["build", "new"])
        .success();

    let reference = format!("new-{run}:latest");
    let python =
        |code: &str| testbed.run_container("builder", &reference, &["python3", "-c", code]);
    assert_eq!(python("import hmext; print(hmext.value())"), "102");
    let shown = testbed.run_container(
        "builder",
        &reference,
        &["python3", "-m", "pip", "show", "-f", "hmext"],
    );
    assert!(shown.contains("Version: 0.2.0"), "{shown}");
    assert!(!shown.contains("hmold"), "{shown}");
    testbed.run_container("builder", &reference, &["python3", "-m", "pip", "check"]);
    let left = testbed.run_container(
        "builder",
        &reference,
        &[
            "sh",
            "-c",
            "ls -d /usr/local/lib/python3.11/dist-packages/hmext* /usr/local/lib/python3.11/dist-packages/hmold* 2>/dev/null | sed 's|.*/||'",
        ],
    );
    assert_eq!(
        left.lines().filter(|l| l.contains("dist-info")).count(),
        1,
        "{left}"
    );
    assert!(!left.contains("hmold"), "{left}");
}

/// Bad `[[compile]]` tables are refused by `check` with exit 2, naming the file, line and key.
#[test]
fn malformed_compile_stages_are_refused_with_their_key() {
    let cases = [
        (
            "[[compile]]\nname = \"x\"\nsources = [\"nope\"]\nrun = [\"true\"]\nwheels = [\"x\"]\n",
            "compile.sources",
            "no [[source]] named `nope`",
        ),
        (
            "[[source]]\nname = \"s\"\ngit = \"/tmp/x\"\nrev = \"main\"\ndest = \"/src/s\"\n\n[[compile]]\nname = \"x\"\nrun = [\"true\"]\nwheels = [\"x\"]\n",
            "source",
            "built by no [[compile]] stage",
        ),
        (
            "[[compile]]\nname = \"x\"\nrun = [\"true\"]\nwheels = [\"x\"]\n\n[compile.caches.cc]\npath = \"/c\"\ncap = \"lots\"\n",
            "compile.caches.cc.cap",
            "`lots` is not a size",
        ),
        (
            "[[compile]]\nname = \"x\"\nrun = [\"true\"]\nwheels = [\"x\"]\ntoolchain = \"tools@sha256:0000000000000000000000000000000000000000000000000000000000000000\"\n",
            "compile.toolchain",
            "carries a digest",
        ),
        (
            "[[compile]]\nname = \"x\"\nrun = [\"true\"]\nwheels = [\"x\"]\ncache = \"typo\"\n",
            "cache",
            "unknown field `cache`",
        ),
        (
            "[[compile]]\nname = \"x\"\nrun = [\"true\"]\nwheels = [\"x\"]\ntoolchain = \"tools:1\"\ntoolchain-image = \"tools\"\n",
            "compile.toolchain",
            "not both",
        ),
        (
            "[[compile]]\nname = \"x\"\nrun = [\"true\"]\nwheels = [\"x\"]\ntoolchain-image = \"tools\"\n",
            "compile.toolchain-image",
            "no image `tools`",
        ),
        (
            "[[compile]]\nname = \"x\"\nrun = [\"true\"]\nwheels = [\"x\"]\ntoolchain-image = \"bad\"\n",
            "compile.toolchain-image",
            "a stage cannot run in the image it makes",
        ),
        (
            "[[compile]]\nname = \"x\"\nrun = [\"true\"]\nwheels = [\"x\"]\napt = [\"cmake\", \"-oAPT::x=1\"]\n",
            "compile.apt",
            "`-oAPT::x=1` is not a package name",
        ),
    ];
    for (table, key, message) in cases {
        let project = TestProject::new();
        project.write(
            "images/bad/image.toml",
            &format!("[from]\nref = \"busybox:latest\"\n\n{table}"),
        );
        let run = project.run(&["check", "bad"]);
        assert_eq!(run.code(), 2, "{}", run.stderr());
        let stderr = run.stderr();
        assert!(stderr.contains("images/bad/image.toml:"), "{stderr}");
        assert!(stderr.contains(key), "{key}: {stderr}");
        assert!(stderr.contains(message), "{message}: {stderr}");
    }
}

/// Issue 16 item 1 and issue 33: a stage runs in another spec of the project with apt
/// packages added, pinned by `lock` against the toolchain's own archive and installed from
/// their files with no network; the toolchain image with the packages is made once and kept
/// (a second compile runs no apt container), is the same image on another builder, the
/// packages stay out of the image, and a package no archive has is named by `lock`.
#[test]
fn a_stage_runs_in_another_spec_with_apt_packages_added_once() {
    let testbed = Testbed::get();
    let compile = CompileProject::new(
        r#""test \"$(echo 41 | jq .)\" = 41", "cd /src/hmext && python3 -m pip wheel --no-deps --no-build-isolation -w $HALLMARK_WHEELS .""#,
        "",
    );
    compile.project.write(
        "images/tools/image.toml",
        &format!(
            r#"[image]
name = "tools-{}"

[from]
ref = "hallmark-testbed/toolchain:bookworm"
"#,
            compile.name
        ),
    );
    compile.edit(
        "toolchain = \"hallmark-testbed/toolchain:bookworm\"",
        "toolchain-image = \"tools\"\napt = [\"jq\"]",
    );
    compile.hallmark(&["lock", "tools", "cext"]).success();

    let rendered = compile.hallmark(&["render", "cext"]).success().stdout();
    let shown = rendered
        .lines()
        .find(|l| l.contains("toolchain: the image `tools`"))
        .unwrap_or_else(|| panic!("{rendered}"));
    let kept = shown
        .split("kept as ")
        .nth(1)
        .and_then(|rest| rest.strip_suffix(')'))
        .unwrap_or_else(|| panic!("{shown}"))
        .to_string();
    assert!(shown.contains("+ apt jq="), "{shown}");

    let since = now();
    let built = compile
        .hallmark(&["--json", "build", "cext"])
        .success()
        .stdout();
    let records = support::document(&built);
    let names: Vec<&str> = records
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["image"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["tools", "cext"],
        "the toolchain spec is built first: {built}"
    );
    let key = testbed.docker_ok(
        "builder",
        &[
            "image",
            "inspect",
            "--format",
            "{{index .Config.Labels \"hallmark.toolchain\"}}",
            &kept,
        ],
    );
    let apt_runs = |since: &str| {
        let filter = format!("label=hallmark.toolchain={}", key.trim());
        let format = "apt{{index .Actor.Attributes \"hallmark.compile\"}}";
        // Compile containers carry the toolchain image's label too.
        let created = created_since(since, &filter, format);
        created.iter().filter(|l| l.trim() == "apt").count()
    };
    assert_eq!(apt_runs(&since), 1);
    let reference = format!("{}:latest", compile.name);
    let value = testbed.run_container(
        "builder",
        &reference,
        &[
            "sh",
            "-c",
            "python3 -c 'import hmext; print(hmext.value())'; command -v jq || echo none",
        ],
    );
    assert_eq!(value, "141\nnone", "the package stays in the toolchain");

    // Another compile of the stage (an arg changed) in the kept toolchain: no apt again.
    compile.edit(
        "CCACHE_NOHASHDIR = \"1\"",
        "CCACHE_NOHASHDIR = \"1\"\nMAX_JOBS = \"1\"",
    );
    let since = now();
    compile.hallmark(&["build", "cext"]).success();
    assert_eq!(compile.containers_created_since(&since), 1);
    assert_eq!(apt_runs(&since), 0);

    // The same key on another builder: the same toolchain image.
    let node3 = testbed.node_of("20", "classic");
    testbed.script("load-bases", &["--node", &node3, "--toolchain"]);
    let other = testbed.config_with_builder(compile.project.root(), &node3);
    // A cache of its own: the stage's wheels are not kept there, the packages are fetched.
    let fresh = compile.project.root().join(".other-cache");
    let fresh = fresh.to_str().unwrap();
    compile
        .project
        .with_config(&other)
        .run_with(&["build", "cext"], &[("HALLMARK_CACHE", fresh)])
        .success();
    assert_eq!(
        testbed.image_id(&node3, &kept),
        testbed.image_id("builder", &kept),
        "the toolchain with the same pinned packages differs between builders"
    );
    let _ = testbed.docker(&node3, &["rmi", &kept]);

    // A package no archive has: `lock` names it; `check` refuses the unpinned stage.
    compile.edit("apt = [\"jq\"]", "apt = [\"jq\", \"hm-no-such-tool\"]");
    let check = compile.hallmark(&["check", "cext"]);
    assert_eq!(check.code(), 2, "{}", check.stderr());
    assert!(
        check.stderr().contains("`hm-no-such-tool` has no pin"),
        "{}",
        check.stderr()
    );
    let failed = compile.hallmark(&["lock", "cext"]);
    assert_ne!(failed.code(), 0, "{}", failed.stderr());
    let stderr = failed.stderr();
    assert!(stderr.contains("no package `hm-no-such-tool`"), "{stderr}");
    let _ = testbed.docker("builder", &["rmi", &kept]);
}
