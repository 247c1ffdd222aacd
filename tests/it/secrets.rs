//! Credentials that git and pip need on the host stay on the host: a sentinel password, asked
//! for by a real HTTP server in front of the git source and the wheel index, appears in no
//! output, file, label, history entry or layer that lock, build and distribute produce.

use crate::support;

use std::io::BufRead;
use std::path::Path;
use std::process::{Command, Stdio};
use support::{GitRepo, TestProject, Testbed, unique};

/// The server, killed when the test ends however it ends.
struct Server(std::process::Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Every file below `dir` that holds `needle`.
fn files_holding(dir: &Path, needle: &[u8]) -> Vec<String> {
    walkdir::WalkDir::new(dir)
        .into_iter()
        .flatten()
        .filter(|e| e.file_type().is_file())
        .filter(|e| std::fs::read(e.path()).is_ok_and(|b| contains(&b, needle)))
        .map(|e| e.path().display().to_string())
        .collect()
}

#[test]
fn a_sentinel_secret_reaches_no_output_file_label_or_layer() {
    let testbed = Testbed::get();
    let project = TestProject::new();
    let run = unique();
    let sentinel = format!("hm-sentinel-{run}-secret");

    // What the server serves: a dumb-HTTP git repository and a PEP 503 index with one wheel.
    let served = project.root().join("served");
    let upstream = GitRepo::new(project.root(), "upstream");
    upstream.commit(&[("README", "the source\n")], "first");
    let bare = served.join("src.git");
    upstream.git(&["clone", "--quiet", "--bare", ".", bare.to_str().unwrap()]);
    let update = Command::new("git")
        .args(["update-server-info"])
        .current_dir(&bare)
        .status()
        .unwrap();
    assert!(update.success());
    support::write_fixture_wheel(&served.join("files"));
    std::fs::create_dir_all(served.join("simple/hmtool")).unwrap();
    std::fs::write(
        served.join("simple/hmtool/index.html"),
        "<a href=\"../../files/hmtool-0.1.0-py3-none-any.whl\">hmtool-0.1.0-py3-none-any.whl</a>\n",
    )
    .unwrap();
    let log = project.root().join("server.log");
    let mut child = Command::new("python3")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/auth_server.py"))
        .args([
            served.to_str().unwrap(),
            "u",
            &sentinel,
            log.to_str().unwrap(),
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut port = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut port)
        .unwrap();
    let _server = Server(child);
    let port = port.trim();
    assert!(!port.is_empty(), "the server printed its port");

    project
        .write(
            "images/app/image.toml",
            &format!(
                r#"
[image]
name = "secret-app-{run}"

[from]
ref = "hallmark-testbed/python:bookworm"

[[source]]
name = "src"
git = "http://127.0.0.1:{port}/src.git"
rev = "main"
dest = "/src/app"

[labels]
"test.run" = "{run}"

[[smoke]]
name = "source"
run = ["cat", "/src/app/README"]
"#
            ),
        )
        .write(
            "images/addon/image.toml",
            &format!(
                r#"
[image]
name = "secret-addon-{run}"

[from]
image = "app"

[[wheel]]
name = "hmtool"
version = "0.1.0"

[labels]
"test.run" = "{run}"

[[smoke]]
name = "tool"
run = ["hmtool"]
"#
            ),
        );

    // The secrets live where a user keeps them: a credential helper for git, the index URL
    // for pip, a token in the environment.
    let config = testbed.config();
    let hallmark = |args: &[&str]| {
        let output = support::hallmark_at(&config)
            .args(["-v"])
            .args(args)
            .current_dir(project.root())
            .env("HALLMARK_CACHE", project.root().join(".test-cache"))
            .env("GIT_TERMINAL_PROMPT", "0")
            .env("GIT_CONFIG_COUNT", "1")
            .env("GIT_CONFIG_KEY_0", "credential.helper")
            .env(
                "GIT_CONFIG_VALUE_0",
                format!("!f() {{ echo username=u; echo password={sentinel}; }}; f"),
            )
            .env(
                "PIP_INDEX_URL",
                format!("http://u:{sentinel}@127.0.0.1:{port}/simple/"),
            )
            .env("PIP_NO_CACHE_DIR", "1")
            .env("HF_TOKEN", &sentinel)
            .env_remove("DOCKER_HOST")
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "hallmark {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        [output.stdout, output.stderr].concat()
    };
    let mut printed = Vec::new();
    printed.extend(hallmark(&["lock", "app", "addon"]));
    printed.extend(hallmark(&["build", "addon"]));
    printed.extend(hallmark(&["distribute", "addon", "--to", "node4"]));
    printed.extend(hallmark(&["verify", "addon", "--nodes", "node4"]));

    // The secrets were needed: the server refused the first, bare requests and served the
    // ones that carried them.
    let requests = std::fs::read_to_string(&log).unwrap();
    assert!(requests.contains("denied "), "{requests}");
    assert!(requests.contains("ok /src.git/info/refs"), "{requests}");
    assert!(requests.contains("ok /files/hmtool-0.1.0"), "{requests}");

    let needle = sentinel.as_bytes();
    assert!(
        !contains(&printed, needle),
        "printed: {}",
        String::from_utf8_lossy(&printed)
    );
    // The project (pins, state, logs, build records) and hallmark's cache (sources, wheels,
    // the layer store); the server's own folder holds no secret either, so scan it all but
    // the server's log.
    std::fs::remove_file(&log).unwrap();
    assert_eq!(files_holding(project.root(), needle), Vec::<String>::new());
    for (node, image) in [
        ("builder", format!("secret-app-{run}:latest")),
        ("builder", format!("secret-addon-{run}:latest")),
        ("node4", format!("secret-addon-{run}:latest")),
    ] {
        let inspect = testbed.docker(node, &["image", "inspect", &image]);
        assert!(inspect.status.success(), "{node} holds {image}");
        assert!(
            !contains(&inspect.stdout, needle),
            "{node} {image}: labels or config"
        );
        let history = testbed.docker(node, &["history", "--no-trunc", &image]);
        assert!(
            !contains(&history.stdout, needle),
            "{node} {image}: history"
        );
        let save = testbed.docker(node, &["save", &image]);
        assert!(save.status.success() && save.stdout.len() > 1 << 20);
        assert!(!contains(&save.stdout, needle), "{node} {image}: a layer");
    }
}
