//! One spec, one verdict, on every engine kind of the testbed: Docker 20.10 (the builder, and
//! the ssh node), Docker 26 and 28 with the containerd image store, Docker 28 with the classic
//! store, and Podman 4.3. Each engine has its own defaults for what a container runs (Podman's
//! Docker-compatible API took an empty entrypoint as "the image's", Docker an empty cmd as
//! "the image's"); hallmark says the whole argv, so the verdicts agree (issue 55).

use crate::support::{self, OwnTestbed, TestProject};

/// An image whose ENTRYPOINT exits 0 when it is given any argument (the shape of a launcher
/// that swallows what it is passed), and whose CMD is such an argument. A test that names a
/// failing program fails on every engine kind (on Podman it passed: `false` reached the
/// entrypoint as an argument); a test's argv runs as written (its output says so); and a
/// served test with `serve = true` and `args = []` starts the entrypoint with no argument
/// (Docker gave it the image's CMD).
#[test]
fn a_smoke_test_runs_what_its_spec_says_on_every_engine_kind() {
    let testbed = OwnTestbed::up(&[
        "--nodes",
        "5",
        "--kind",
        "node1=podman",
        "--kind",
        "node3=26/containerd",
        "--kind",
        "node4=28/classic",
    ]);
    let config = testbed.config();
    let run = support::unique();
    let project = TestProject::new();
    let entrypoint = format!(
        "[ $# -eq 0 ] || {{ echo entrypoint-got-$*; exit 0; }}; mkdir -p /tmp/www && echo served-{run} > /tmp/www/index.html && exec httpd -f -p 127.0.0.1:8080 -h /tmp/www"
    );
    project
        .write("pins/entry.toml", crate::support::hello_pins())
        .write(
            "images/entry/image.toml",
            &format!(
                r#"[image]
name = "entry-{run}"

[from]
ref = "hallmark-testbed/busybox:latest"

[container]
entrypoint = ["sh", "-c", "{entrypoint}", "entry"]
cmd = ["unexpected-cmd"]

[[smoke]]
name = "runs its argv"
run = ["sh", "-c", "echo argv-ran"]
expect = "^argv-ran"

[[smoke]]
name = "served with no args"
serve = true
args = []
ready = ["wget", "-q", "-O", "/dev/null", "http://127.0.0.1:8080/"]
run = ["wget", "-q", "-O", "-", "http://127.0.0.1:8080/"]
expect = "served-{run}"
timeout = 60

[[smoke]]
name = "host ipc with a shm size"
on = "nodes"
run = ["true"]
ipc = "host"
shm_size = "16m"

[[smoke]]
name = "fails"
on = "nodes"
run = ["false"]
"#
            ),
        );
    // The build's smoke (the two tests not `on = "nodes"`) on the Docker 20.10 builder.
    project
        .with_config(&config)
        .run(&["-q", "build", "entry"])
        .success();
    let nodes = testbed.nodes();
    let all = nodes.join(",");
    project
        .with_config(&config)
        .run(&["-q", "distribute", "entry", "--to", &all])
        .success();
    let smoked = project
        .with_config(&config)
        .run(&["--json", "smoke", "entry", "--all-nodes"]);
    assert_eq!(smoked.code(), 1, "{}", smoked.stderr());
    let rows = support::document(&smoked.stdout());
    let rows = rows.as_array().unwrap();
    for node in &nodes {
        let row = |name: &str| {
            rows.iter()
                .find(|r| r["node"] == node.as_str() && r["name"] == name)
                .unwrap_or_else(|| panic!("{node}: no row of `{name}`: {rows:?}"))
        };
        let failed = row("fails");
        assert_eq!(failed["passed"], false, "{node}: {failed}");
        assert_eq!(failed["exit_code"], 1, "{node}: {failed}");
        // Podman's compatible API refused `shm_size` with `ipc = "host"`, which Docker takes.
        for name in [
            "runs its argv",
            "served with no args",
            "host ipc with a shm size",
        ] {
            assert_eq!(row(name)["passed"], true, "{node}: {}", row(name));
        }
    }
}
