//! Test fixtures: a project in a temp folder, real git repositories, and the real binary.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub struct TestProject {
    pub dir: tempfile::TempDir,
}

impl TestProject {
    pub fn new() -> TestProject {
        let dir = tempfile::Builder::new()
            .prefix("hallmark-test")
            .tempdir()
            .unwrap();
        std::fs::create_dir_all(dir.path().join("images")).unwrap();
        // What makes the folder a project (an empty cluster file: the local engine).
        std::fs::write(dir.path().join("hallmark.toml"), "").unwrap();
        TestProject { dir }
    }

    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    pub fn write(&self, relative: &str, text: &str) -> &Self {
        let path = self.root().join(relative);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
        self
    }

    pub fn read(&self, relative: &str) -> String {
        std::fs::read_to_string(self.root().join(relative)).unwrap()
    }

    /// Runs hallmark in the project root with a private cache.
    pub fn run(&self, args: &[&str]) -> Run {
        run_in(self.root(), args)
    }

    /// hallmark in this project on the cluster file `config`: each run is
    /// `hallmark --config CONFIG ARGS...`, as [`TestProject::run`] runs it.
    pub fn with_config(&self, config: impl AsRef<Path>) -> Configured<'_> {
        Configured {
            project: self,
            config: config.as_ref().to_path_buf(),
        }
    }
}

/// A project and its cluster file ([`TestProject::with_config`]).
pub struct Configured<'a> {
    pub project: &'a TestProject,
    pub config: PathBuf,
}

impl Configured<'_> {
    /// `hallmark --config CONFIG ARGS...` in the project root with a private cache.
    pub fn run(&self, args: &[&str]) -> Run {
        self.run_with(args, &[])
    }

    /// [`Configured::run`] with these environment variables set.
    pub fn run_with(&self, args: &[&str], env: &[(&str, &str)]) -> Run {
        let config = self.config.to_str().expect("a UTF-8 config path");
        let mut all = vec!["--config", config];
        all.extend_from_slice(args);
        run_in_with(self.project.root(), &all, env)
    }
}

/// `text` with the project's temporary root written `[project]`, for snapshots.
pub fn without_root(project: &TestProject, text: &str) -> String {
    without_dir(text, project.root(), "[project]")
}

/// `text` with the folder `dir` (as given, and its canonical path) written `name`, for
/// snapshots.
pub fn without_dir(text: &str, dir: &Path, name: &str) -> String {
    let canonical = dir.canonicalize().unwrap();
    text.replace(&canonical.display().to_string(), name)
        .replace(&dir.display().to_string(), name)
}

/// What a user reads of `run`, for snapshots: `exit N`, stdout, then `stderr:` and stderr,
/// the project's temporary root written `[project]`.
pub fn transcript(project: &TestProject, run: &Run) -> String {
    // The lines a command says while at work where stderr is no terminal (every 10 s: a
    // slow machine gives one more or less) are not part of what it reports.
    let stderr: String = run
        .stderr()
        .split_inclusive('\n')
        .filter(|l| !(l.starts_with("hallmark ") && l.contains(": still at work, ")))
        .collect();
    let text = format!("exit {}\n{}stderr:\n{}", run.code(), run.stdout(), stderr);
    without_root(project, &text)
}

/// What a user reads of `run` on the cluster file `config` (the testbed's): [`transcript`] with
/// the engine addresses `config` names written `[engine]`, each of the project's image names
/// (`name = ` in images/FOLDER/image.toml) `[FOLDER]`, and runs of hex `[hex]`.
pub fn testbed_transcript(project: &TestProject, config: &Path, run: &Run) -> String {
    let mut text = transcript(project, run);
    let cluster = std::fs::read_to_string(config).unwrap();
    for engine in cluster.lines().filter_map(|l| l.strip_prefix("engine = ")) {
        text = text.replace(engine.trim_matches('"'), "[engine]");
    }
    let mut folders: Vec<String> = std::fs::read_dir(project.root().join("images"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    folders.sort();
    for folder in folders {
        let spec = project
            .root()
            .join("images")
            .join(&folder)
            .join("image.toml");
        let Ok(spec) = std::fs::read_to_string(spec) else {
            continue;
        };
        if let Some(name) = spec.lines().find_map(|l| l.strip_prefix("name = ")) {
            text = text.replace(name.trim_matches('"'), &format!("[{folder}]"));
        }
    }
    without_hex(&text)
}

/// `text` with each cell of the right-aligned column titled `title` written `placeholder`,
/// ending where it ended: from the line under the header that holds `title` to the first
/// line without such a cell. For columns whose values vary (bytes, seconds).
pub fn without_column(text: &str, title: &str, placeholder: &str) -> String {
    let mut end: Option<usize> = None;
    let lines = text.split('\n').map(|line| {
        let Some(e) = end else {
            end = line.find(title).map(|i| i + title.len());
            return line.to_string();
        };
        let bytes = line.as_bytes();
        if bytes.len() < e || !line.is_char_boundary(e) || bytes[e - 1] == b' ' {
            end = None;
            return line.to_string();
        }
        let start = line[..e].rfind(' ').map_or(0, |i| i + 1);
        let width = (e - start).max(placeholder.len());
        let from = e.checked_sub(width).expect("room for the placeholder");
        assert!(
            line[from..start].bytes().all(|b| b == b' '),
            "no room for {placeholder} in {line:?}"
        );
        format!("{}{placeholder:>width$}{}", &line[..from], &line[e..])
    });
    lines.collect::<Vec<_>>().join("\n")
}

/// `text` with every run of 12 or more hex digits (checksums, ids, digests) written `[hex]`.
pub fn without_hex(text: &str) -> String {
    let mut out = String::new();
    let mut run = String::new();
    for c in text.chars().chain(['\n']) {
        if c.is_ascii_hexdigit() {
            run.push(c);
            continue;
        }
        out.push_str(if run.len() >= 12 { "[hex]" } else { &run });
        run.clear();
        out.push(c);
    }
    out.pop();
    out
}

/// The binary under test; `HALLMARK_TEST_BIN` runs the suite against another build (an
/// older one, to see a new test fail before its fix).
pub fn hallmark() -> Command {
    match std::env::var_os("HALLMARK_TEST_BIN") {
        Some(bin) => Command::new(bin),
        None => Command::new(env!("CARGO_BIN_EXE_hallmark")),
    }
}

/// [`hallmark`] on the cluster file `config` (`--config CONFIG`), for runs that set their own
/// folder, cache or environment.
pub fn hallmark_at(config: impl AsRef<Path>) -> Command {
    let mut command = hallmark();
    command.arg("--config").arg(config.as_ref());
    command
}

pub fn run_in(dir: &Path, args: &[&str]) -> Run {
    run_in_with(dir, args, &[])
}

/// [`run_in`] with these environment variables set.
pub fn run_in_with(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Run {
    let output = hallmark()
        .args(args)
        .current_dir(dir)
        .env("HALLMARK_CACHE", dir.join(".test-cache"))
        .env_remove("DOCKER_HOST")
        .env_remove("DOCKER_CONTEXT")
        .env_remove("DOCKER_TLS_VERIFY")
        .env_remove("HALLMARK_NORMALIZE_FROM")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    Run(output)
}

pub struct Run(pub Output);

impl Run {
    pub fn code(&self) -> i32 {
        self.0
            .status
            .code()
            .expect("exited, not killed by a signal")
    }
    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.0.stdout).into_owned()
    }
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.0.stderr).into_owned()
    }
    #[track_caller]
    pub fn success(&self) -> &Self {
        assert_eq!(
            self.code(),
            0,
            "stdout:\n{}\nstderr:\n{}",
            self.stdout(),
            self.stderr()
        );
        self
    }
}

/// A real git repository with one file per commit; returns its path.
pub struct GitRepo {
    pub path: PathBuf,
}

impl GitRepo {
    pub fn new(parent: &Path, name: &str) -> GitRepo {
        let path = parent.join(name);
        std::fs::create_dir_all(&path).unwrap();
        let repo = GitRepo { path };
        repo.git(&["init", "--quiet", "--initial-branch=main"]);
        repo
    }

    pub fn git(&self, args: &[&str]) -> String {
        let output = Command::new("git")
            .args([
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@example.org",
                "-c",
                "commit.gpgsign=false",
                "-c",
                "tag.gpgsign=false",
            ])
            .args(args)
            .current_dir(&self.path)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).trim().to_string()
    }

    /// Writes files and commits them; returns the commit id.
    pub fn commit(&self, files: &[(&str, &str)], message: &str) -> String {
        for (name, text) in files {
            let path = self.path.join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        self.git(&["add", "-A"]);
        self.git(&["commit", "--quiet", "-m", message]);
        self.git(&["rev-parse", "HEAD"])
    }

    pub fn url(&self) -> String {
        self.path.display().to_string()
    }
}

/// A unified diff changing `old` to `new` in `file` (a one-line file).
pub fn one_line_patch(file: &str, old: &str, new: &str) -> String {
    format!("--- a/{file}\n+++ b/{file}\n@@ -1 +1 @@\n-{old}\n+{new}\n")
}

/// A running testbed (scripts/testbed): the one named by `HALLMARK_TESTBED`, else one this
/// test binary starts under `target/testbed` and leaves running for the next test run
/// (`scripts/testbed down --dir target/testbed` stops it). No engine is a failure, not a skip.
pub struct Testbed {
    pub dir: PathBuf,
    pub env: std::collections::HashMap<String, String>,
}

impl Testbed {
    pub fn get() -> &'static Testbed {
        static TESTBED: std::sync::OnceLock<Testbed> = std::sync::OnceLock::new();
        TESTBED.get_or_init(|| {
            let root = Path::new(env!("CARGO_MANIFEST_DIR"));
            let dir = match std::env::var_os("HALLMARK_TESTBED") {
                Some(dir) => PathBuf::from(dir),
                None => root.join("target/testbed"),
            };
            let script = root.join("scripts/testbed");
            let running = Command::new(&script).args(["status", "--dir"]).arg(&dir).output().is_ok_and(|o| o.status.success());
            if !running {
                let status = Command::new(&script).args(["up", "--nodes", "4", "--dir"]).arg(&dir).status().unwrap();
                assert!(status.success(), "scripts/testbed up failed: the engine tests need real engines (run `scripts/testbed install` as root first)");
            }
            Testbed::read(dir)
        })
    }

    /// The testbed up in `dir`, as its testbed.env describes it.
    pub fn read(dir: PathBuf) -> Testbed {
        let text = std::fs::read_to_string(dir.join("testbed.env")).expect("testbed.env");
        let env = text
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.trim().to_string(), v.trim().trim_matches('"').to_string()))
            .collect();
        Testbed { dir, env }
    }

    /// Runs `scripts/testbed COMMAND --dir <this testbed> ARGS...`; it must succeed.
    pub fn script(&self, command: &str, args: &[&str]) {
        let output = Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/testbed"))
            .arg(command)
            .arg("--dir")
            .arg(&self.dir)
            .args(args)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "scripts/testbed {command} {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }

    pub fn config(&self) -> PathBuf {
        self.dir.join("hallmark.toml")
    }

    /// The nodes, in order (`HMTB_NODES`).
    pub fn nodes(&self) -> Vec<String> {
        self.env["HMTB_NODES"]
            .split(',')
            .map(str::to_string)
            .collect()
    }

    /// A daemon's engine (`20`, `26`, `28`) and image store (`classic`, `containerd`), as
    /// testbed.env gives them (the layout is scripts/testbed's to choose, not the tests').
    pub fn kind(&self, node: &str) -> (String, String) {
        let key = |what: &str| {
            let key = format!("HMTB_{}_{what}", node.to_uppercase());
            self.env
                .get(&key)
                .unwrap_or_else(|| panic!("no {key} in testbed.env"))
                .clone()
        };
        (key("ENGINE"), key("STORE"))
    }

    /// The first node running `engine` on `store`; there must be one.
    pub fn node_of(&self, engine: &str, store: &str) -> String {
        self.nodes()
            .into_iter()
            .find(|n| self.kind(n) == (engine.to_string(), store.to_string()))
            .unwrap_or_else(|| {
                panic!(
                    "no Docker {engine} node on the {store} store: {:?}",
                    self.env
                )
            })
    }

    /// The nodes on the containerd image store.
    pub fn containerd_nodes(&self) -> Vec<String> {
        self.nodes()
            .into_iter()
            .filter(|n| self.kind(n).1 == "containerd")
            .collect()
    }

    pub fn endpoint(&self, node: &str) -> String {
        let key = format!("HMTB_{}", node.to_uppercase());
        let local = format!("{key}_LOCAL");
        self.env
            .get(&local)
            .or_else(|| self.env.get(&key))
            .unwrap_or_else(|| panic!("no {key} in testbed.env"))
            .clone()
    }

    /// The docker CLI against one daemon of the testbed (reached locally, ssh nodes too).
    pub fn docker(&self, node: &str, args: &[&str]) -> Output {
        Command::new("docker")
            .arg("-H")
            .arg(self.endpoint(node))
            .args(args)
            .output()
            .unwrap()
    }

    /// Runs `command` in a throw-away container of `image` on `node` (no network); it must
    /// succeed. Returns its output.
    pub fn run_container(&self, node: &str, image: &str, command: &[&str]) -> String {
        let mut args = vec!["run", "--rm", "--network", "none", image];
        args.extend_from_slice(command);
        self.docker_ok(node, &args)
    }

    /// The checksum label of `image` on `node`.
    pub fn checksum_label(&self, node: &str, image: &str) -> String {
        self.docker_ok(
            node,
            &[
                "image",
                "inspect",
                "--format",
                "{{index .Config.Labels \"hallmark.checksum\"}}",
                image,
            ],
        )
    }

    /// The id of the image `reference` names on `node`.
    pub fn image_id(&self, node: &str, reference: &str) -> String {
        self.docker_ok(
            node,
            &["image", "inspect", "--format", "{{.Id}}", reference],
        )
    }

    pub fn docker_ok(&self, node: &str, args: &[&str]) -> String {
        let output = self.docker(node, args);
        assert!(
            output.status.success(),
            "docker {args:?} on {node}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).trim().to_string()
    }

    /// Writes a hallmark.toml whose builder is `builder`, for builds on another engine.
    pub fn config_with_builder(&self, dir: &Path, builder: &str) -> PathBuf {
        let path = dir.join(format!("hallmark-{builder}.toml"));
        let text = format!(
            "[builder]\nname = \"{builder}\"\nengine = \"{}\"\n",
            self.endpoint(builder)
        );
        std::fs::write(&path, text).unwrap();
        path
    }
}

/// A testbed of a test's own (for tests that restart its builder or fill a disk), stopped
/// when dropped.
pub struct OwnTestbed {
    testbed: Testbed,
    _dir: tempfile::TempDir,
}

impl OwnTestbed {
    pub fn up(args: &[&str]) -> OwnTestbed {
        let dir = tempfile::Builder::new().prefix("hmtb").tempdir().unwrap();
        let status = Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/testbed"))
            .arg("up")
            .args(args)
            .arg("--dir")
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(status.success(), "scripts/testbed up {args:?} failed");
        OwnTestbed {
            testbed: Testbed::read(dir.path().to_path_buf()),
            _dir: dir,
        }
    }
}

impl std::ops::Deref for OwnTestbed {
    type Target = Testbed;
    fn deref(&self) -> &Testbed {
        &self.testbed
    }
}

impl Drop for OwnTestbed {
    fn drop(&mut self) {
        let _ = Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/testbed"))
            .args(["down", "--dir"])
            .arg(&self.testbed.dir)
            .status();
    }
}

/// The repository's `pins/hello.toml` as `lock` writes it on this machine: its base's digest
/// is that of the testbed's busybox image on the builder, which depends on the host's
/// architecture and Debian's busybox-static (the file in the repository holds an x86_64
/// machine's; on an aarch64 one the same base has another digest).
pub fn hello_pins() -> &'static str {
    const PINNED: &str = include_str!("../../../pins/hello.toml");
    static PINS: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PINS.get_or_init(|| {
        let digest = Testbed::get().image_id("builder", "hallmark-testbed/busybox:latest");
        let pinned = PINNED
            .lines()
            .find_map(|l| l.strip_prefix("digest = \""))
            .and_then(|d| d.strip_suffix('"'))
            .expect("pins/hello.toml names a digest");
        PINNED.replace(pinned, &digest)
    })
}

/// Loads onto the builder `tag`: the host's busybox in an image whose config says `arch`
/// (a stand-in for an image of another platform: its code is the host's, its platform not).
pub fn load_labelled_base(testbed: &Testbed, tag: &str, arch: &str) {
    let helper = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/testbed.d/mkimage.py");
    let dir = tempfile::tempdir().unwrap();
    let (layer, archive) = (dir.path().join("layer.tar"), dir.path().join("image.tar"));
    let made = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "/usr/bin/python3 {helper} busybox-layer --busybox /bin/busybox --out {l} && \
             /usr/bin/python3 {helper} archive --layer {l} --tag {tag} --arch {arch} --out {a} && \
             docker -H {e} load -i {a}",
            l = layer.display(),
            a = archive.display(),
            e = testbed.endpoint("builder")
        ))
        .output()
        .unwrap();
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
}

/// A fresh unique word, so tests sharing a builder never share a checksum.
pub fn unique() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!(
        "{}-{}-{}",
        std::process::id(),
        nanos,
        COUNTER.fetch_add(1, Ordering::SeqCst)
    )
}

/// A tiny wheel with a console script, written the way build backends write them.
pub fn write_fixture_wheel(dir: &std::path::Path) {
    std::fs::create_dir_all(dir).unwrap();
    let script = r#"
import base64, hashlib, sys, zipfile
path = sys.argv[1] + "/hmtool-0.1.0-py3-none-any.whl"
files = {
    "hmtool/__init__.py": "def main():\n    print('hmtool ran')\n",
    "hmtool-0.1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: hmtool\nVersion: 0.1.0\n",
    "hmtool-0.1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    "hmtool-0.1.0.dist-info/entry_points.txt": "[console_scripts]\nhmtool = hmtool:main\n",
}
record = ""
with zipfile.ZipFile(path, "w") as z:
    for name, text in files.items():
        info = zipfile.ZipInfo(name, (1980, 1, 1, 0, 0, 0))
        z.writestr(info, text)
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record += f"{name},sha256={digest},{len(text)}\n"
    record += "hmtool-0.1.0.dist-info/RECORD,,\n"
    z.writestr(zipfile.ZipInfo("hmtool-0.1.0.dist-info/RECORD", (1980, 1, 1, 0, 0, 0)), record)
"#;
    let status = std::process::Command::new("python3")
        .args(["-c", script])
        .arg(dir)
        .status()
        .unwrap();
    assert!(status.success());
}

// Shipping fixtures (tests/ship.rs, tests/faults.rs).

use serde_json::Value;

pub const MIB: u64 = 1024 * 1024;

/// A 256 MiB base of random data and a wrapper adding a 4 MiB layer, under names of their own.
pub fn ship_project(base_mib: u64, suffix: &str) -> TestProject {
    let project = TestProject::new();
    let run = unique();
    project
        .write("pins/base.toml", hello_pins())
        .write(
            "images/base/image.toml",
            &format!(
                "[image]\nname = \"base-{run}\"\n\n[from]\nref = \"hallmark-testbed/busybox:latest\"\n\n[build]\nrun = [\"head -c {} /dev/urandom > /base.bin\"]\n",
                base_mib * MIB
            ),
        )
        .write(
            "images/wrap/image.toml",
            &format!(
                "[image]\nname = \"wrap-{run}\"\n\n[from]\nimage = \"base\"\n\n[build]\nrun = [\"head -c {} /dev/urandom > /wrap.bin\"]\n\n[env]\nVERSION = \"{suffix}\"\n\n[[smoke]]\nname = \"has its layer\"\nrun = [\"test\", \"-s\", \"/wrap.bin\"]\n",
                4 * MIB
            ),
        );
    project
}

pub fn hallmark_json(
    project: &TestProject,
    config: &std::path::Path,
    args: &[&str],
) -> (i32, Value) {
    hallmark_json_with(project, config, args, &[])
}

/// [`hallmark_json`] with these environment variables set.
pub fn hallmark_json_with(
    project: &TestProject,
    config: &std::path::Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> (i32, Value) {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let run = project.with_config(config).run_with(&all, env);
    if serde_json::from_str::<Value>(&run.stdout()).is_err() {
        panic!("not json: {}\n{}", run.stdout(), run.stderr());
    }
    (run.code(), document(&run.stdout()))
}

/// The rows of a `--json` document (docs/json.md): `{"version": 1, "<rows>": [...]}`, checked
/// to be version 1 with one field of rows.
pub fn document(stdout: &str) -> Value {
    let document: Value =
        serde_json::from_str(stdout).unwrap_or_else(|e| panic!("not json ({e}): {stdout}"));
    assert_eq!(document["version"], 1, "{document}");
    let fields: Vec<_> = document
        .as_object()
        .unwrap()
        .iter()
        .filter(|(key, _)| *key != "version")
        .collect();
    assert_eq!(fields.len(), 1, "one field of rows: {document}");
    fields[0].1.clone()
}

/// The row of `node` in a list of per-node rows (`hallmark --json nodes`).
pub fn row<'a>(rows: &'a Value, node: &str) -> &'a Value {
    rows.as_array()
        .unwrap()
        .iter()
        .find(|r| r["node"] == node)
        .unwrap_or_else(|| panic!("no row for {node}: {rows}"))
}

pub fn nodes_of(report: &Value) -> Vec<Value> {
    report
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|i| i["nodes"].as_array().unwrap().clone())
        .collect()
}

pub fn reference(project: &TestProject, image: &str) -> String {
    let spec = project.read(&format!("images/{image}/image.toml"));
    let name = spec
        .lines()
        .find_map(|l| l.strip_prefix("name = "))
        .unwrap()
        .trim_matches('"')
        .to_string();
    format!("{name}:latest")
}

/// In a distribute report: `node` failed with an error naming it and holding each of `why`;
/// every other node took `others` (any action, if `None`) and verified.
pub fn assert_fails_alone(report: &Value, node: &str, others: Option<&str>, why: &[&str]) {
    for entry in nodes_of(report) {
        if entry["node"] == node {
            assert_eq!(entry["action"], "failed", "{entry}");
            let error = entry["error"].as_str().unwrap();
            assert!(error.contains(node), "names the node: {error}");
            for word in why {
                assert!(error.contains(word), "says `{word}`: {error}");
            }
        } else {
            if let Some(action) = others {
                assert_eq!(entry["action"], action, "{entry}");
            }
            assert_eq!(entry["verified"], true, "{entry}");
        }
    }
}

/// A re-run of `distribute wrap` sends to `node` only (as `action`), skips the others, every
/// node verifies, and so does `verify`.
pub fn assert_rerun_finishes_only(project: &TestProject, config: &Path, node: &str, action: &str) {
    let (code, report) = hallmark_json(project, config, &["distribute", "wrap"]);
    assert_eq!(code, 0, "{report}");
    for entry in nodes_of(&report) {
        let expected = if entry["node"] == node {
            action
        } else {
            "skipped"
        };
        assert_eq!(entry["action"], expected, "{entry}");
        assert_eq!(entry["verified"], true, "{entry}");
    }
    let (code, report) = hallmark_json(project, config, &["verify", "wrap"]);
    assert_eq!(code, 0, "{report}");
}

/// hallmark started in the project (private cache), its output piped; for tests that stop it.
pub fn spawn(project: &TestProject, config: &Path, args: &[&str]) -> std::process::Child {
    hallmark_at(config)
        .args(args)
        .current_dir(project.root())
        .env("HALLMARK_CACHE", project.root().join(".test-cache"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits (two minutes at most) until `ready` holds.
pub fn wait_for(what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !ready() {
        assert!(std::time::Instant::now() < deadline, "never saw: {what}");
        std::thread::yield_now();
    }
}

/// 127.0.0.1:<port> leading to the unix socket `socket`: an engine as a `tcp://` node sees
/// it. Serves until the test binary ends.
pub fn tcp_to_unix(socket: &str) -> u16 {
    use std::net::Shutdown;
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    let socket = socket.to_string();
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            let Ok(engine) = std::os::unix::net::UnixStream::connect(&socket) else {
                continue;
            };
            let (mut from_client, mut to_engine) =
                (client.try_clone().unwrap(), engine.try_clone().unwrap());
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut from_client, &mut to_engine);
                let _ = to_engine.shutdown(Shutdown::Write);
            });
            let (mut from_engine, mut to_client) = (engine, client);
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut from_engine, &mut to_client);
                let _ = to_client.shutdown(Shutdown::Write);
            });
        }
    });
    port
}

/// A free TCP port on 127.0.0.1 (for a registry).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind(("127.0.0.1", 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The testbed's cluster file with every node on the registry transport: a registry hallmark
/// starts on `port`, or the running one at `address`.
pub fn registry_config(testbed: &Testbed, run: &str, registry: &str) -> PathBuf {
    let path = testbed.dir.join(format!("hallmark-registry-{run}.toml"));
    let base = std::fs::read_to_string(testbed.config()).unwrap();
    let at = match registry.parse::<u16>() {
        Ok(port) => format!("port = {port}"),
        Err(_) => format!("address = \"{registry}\""),
    };
    std::fs::write(
        &path,
        format!("transport = \"registry\"\n{base}\n[registry]\n{at}\npulls = 4\n"),
    )
    .unwrap();
    path
}

/// An operator's registry (Debian's docker-registry) on 127.0.0.1, running until dropped:
/// unlike the one hallmark starts, it outlives a distribute, so a test can pull from it as
/// an operator would.
pub struct OperatorRegistry {
    pub address: String,
    child: std::process::Child,
}

impl OperatorRegistry {
    pub fn start(dir: &Path) -> OperatorRegistry {
        let port = free_port();
        let storage = dir.join("operator-registry");
        std::fs::create_dir_all(&storage).unwrap();
        let config = dir.join("operator-registry.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{port}\n",
                storage.display()
            ),
        )
        .unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("docker-registry (scripts/testbed install puts it there)");
        let mut registry = OperatorRegistry {
            address: format!("127.0.0.1:{port}"),
            child,
        };
        wait_for("the registry listening", || {
            assert!(
                registry.child.try_wait().unwrap().is_none(),
                "docker-registry exited"
            );
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        registry
    }
}

impl Drop for OperatorRegistry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Testbed {
    /// `docker save` of `image` on `node` gives an archive that holds the image: its config
    /// and every layer its manifest names. (Docker 28 "saves" an image whose content it lacks
    /// as a manifest alone, and succeeds.)
    pub fn assert_saves_whole(&self, node: &str, image: &str) {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("saved.tar");
        self.docker_ok(node, &["save", "-o", file.to_str().unwrap(), image]);
        let tar = |mode: &str, members: &[&str]| {
            let output = Command::new("tar")
                .arg(mode)
                .arg(&file)
                .args(members)
                .output()
                .unwrap();
            assert!(output.status.success(), "tar {mode} {members:?}");
            String::from_utf8(output.stdout).unwrap()
        };
        let entries: std::collections::HashSet<String> =
            tar("-tf", &[]).lines().map(str::to_string).collect();
        let manifest: Value = serde_json::from_str(&tar("-xOf", &["manifest.json"])).unwrap();
        let layers = self.docker_ok(
            node,
            &[
                "image",
                "inspect",
                "--format",
                "{{len .RootFS.Layers}}",
                image,
            ],
        );
        let saved = &manifest[0];
        let config = saved["Config"].as_str().unwrap_or_default();
        let paths: Vec<&str> = saved["Layers"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        assert!(
            entries.contains(config),
            "{node}: the saved {image} lacks its config {config:?}: {entries:?}"
        );
        assert_eq!(paths.len().to_string(), layers, "{node}: {manifest}");
        for path in paths {
            assert!(
                entries.contains(path),
                "{node}: the saved {image} lacks layer {path}: {entries:?}"
            );
        }
    }

    /// The nodes on the containerd store that this machine reaches by socket (a registry on
    /// its loopback is theirs too).
    /// Runs containerd's `ctr` in the engine namespace (`moby`) of the containerd-store
    /// `node`; panics on failure.
    pub fn ctr(&self, node: &str, args: &[&str]) -> String {
        let conf = std::fs::read_to_string(self.dir.join(format!("nodes/{node}.conf"))).unwrap();
        let setting = |key: &str| {
            conf.lines()
                .find_map(|l| l.strip_prefix(&format!("{key}=")))
                .unwrap_or_else(|| panic!("no {key} in {conf}"))
                .to_string()
        };
        let output = Command::new(format!("{}/usr/bin/ctr", setting("ENGINE_ROOT")))
            .args(["--address", &setting("CTD_SOCK"), "-n", "moby"])
            .args(args)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "ctr {args:?} on {node}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    pub fn local_containerd_nodes(&self) -> Vec<String> {
        self.containerd_nodes()
            .into_iter()
            .filter(|n| self.env[&format!("HMTB_{}", n.to_uppercase())].starts_with("unix://"))
            .collect()
    }
}

/// A Python virtual environment with the outside tools that check what hallmark writes: the
/// SPDX and CycloneDX validators and securesystemslib's DSSE. Made on first use, from PyPI
/// (which must be reachable), in target/python-tools; a file lock keeps two test processes
/// from making it at once.
pub fn python_tools() -> &'static Path {
    static TOOLS: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    TOOLS.get_or_init(|| {
        let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("target");
        let dir = target.join("python-tools");
        std::fs::create_dir_all(&target).unwrap();
        let lock = std::fs::File::create(target.join("python-tools.lock")).unwrap();
        lock.lock().unwrap();
        if !dir.join("ready").is_file() {
            let _ = std::fs::remove_dir_all(&dir);
            let made = Command::new("python3")
                .args(["-m", "venv"])
                .arg(&dir)
                .status()
                .unwrap();
            assert!(made.success(), "python3 -m venv {}", dir.display());
            let installed = Command::new(dir.join("bin/pip"))
                .args([
                    "install",
                    "-q",
                    "spdx-tools==0.8.5",
                    "cyclonedx-python-lib[json-validation]==11.12.0",
                    "securesystemslib[crypto]==1.6.0",
                ])
                .status()
                .unwrap();
            assert!(
                installed.success(),
                "pip install of the checking tools into {}",
                dir.display()
            );
            std::fs::write(dir.join("ready"), "").unwrap();
        }
        dir
    })
}

/// An ed25519 key pair without a passphrase at `path` and `path.pub` (`ssh-keygen`), as an
/// operator makes the provenance key.
pub fn ed25519_key(path: &Path) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let made = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(path)
        .status()
        .unwrap();
    assert!(made.success(), "ssh-keygen {}", path.display());
}

/// Writes `text` to `path`, mode 0755, in a child process (`sh -c 'cat > FILE'`), so that it
/// can be run at once: a file this process opened for writing may be held open by a fork
/// another test thread makes meanwhile (until that child execs), and running the file then
/// fails with `Text file busy` (ETXTBSY; a CI run saw it). No descriptor of this process
/// ever points at the file.
pub fn write_executable(path: &Path, text: &str) {
    use std::io::Write;
    let mut writer = Command::new("sh")
        .args(["-c", "cat > \"$1\" && chmod 755 \"$1\"", "sh"])
        .arg(path)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    writer
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let status = writer.wait().unwrap();
    assert!(status.success(), "writing {}: {status}", path.display());
}
