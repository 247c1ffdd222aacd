//! Podman as a node: Debian 12's Podman 4.3 (`podman system service`, rootful, its own
//! storage) on a testbed of its own (`--kind node1=podman`), beside a Docker 20.10 ssh node.
//! Distribute, verify, status and smoke work on it as on Docker; the registry transport is
//! refused by name (docs/shipping.md), and `auto` sends it everything by stream.

use crate::support::{self, OwnTestbed, hallmark_json, nodes_of, reference, ship_project};

/// Images whose config carries fields Podman's inspect leaves out (`HEALTHCHECK`, `SHELL`,
/// `ONBUILD`), several at once (Podman ANDs the names of one listing), and a `localhost/`
/// name that shadows the short one (`mismatch` until distribute names the shipped image
/// so): every image is shipped once, verified, listed `current` by status, skipped the
/// second time, its signed provenance verified there
/// (`verify --provenance`), and smoke-tested on the node.
#[test]
fn a_podman_node_is_shipped_to_verified_listed_and_smoke_tested() {
    let testbed = OwnTestbed::up(&["--nodes", "2", "--kind", "node1=podman"]);
    let project = ship_project(1, "podman");
    // Signed provenance too (issue 34): `verify --provenance` on the Podman node below.
    support::ed25519_key(&project.root().join("keys/hallmark"));
    let config = project.root().join("cluster.toml");
    let cluster = std::fs::read_to_string(testbed.config()).unwrap();
    std::fs::write(
        &config,
        format!(
            "{cluster}\n[provenance]\nkey = \"keys/hallmark\"\ntrusted = [\"keys/hallmark.pub\"]\n\n[registry]\nport = {}\n",
            support::free_port()
        ),
    )
    .unwrap();

    // A base built by the builder's engine with the three fields Podman does not report.
    let base = format!("configured-{}:latest", support::unique());
    let dir = project.root().join("configured");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("Dockerfile"),
        "FROM hallmark-testbed/busybox:latest\nHEALTHCHECK --interval=30s CMD true\nSHELL [\"/bin/sh\", \"-c\"]\nONBUILD RUN true\n",
    )
    .unwrap();
    let built = std::process::Command::new("docker")
        .args([
            "-H",
            &testbed.endpoint("builder"),
            "build",
            "-q",
            "-t",
            &base,
        ])
        .arg(&dir)
        .env("DOCKER_BUILDKIT", "0")
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let name = format!("configured-image-{}", support::unique());
    project.write(
        "images/configured/image.toml",
        &format!("[image]\nname = \"{name}\"\n\n[from]\nref = \"{base}\"\n\n[build]\nrun = [\"echo configured > /configured.txt\"]\n"),
    );
    project
        .with_config(&config)
        .run(&["-q", "lock", "configured"])
        .success();
    project
        .with_config(&config)
        .run(&["-q", "build", "wrap", "configured"])
        .success();

    let images = ["base", "wrap", "configured"];
    let mut args = vec!["distribute"];
    args.extend(images);
    args.extend(["--to", "node1,node2"]);
    let (code, report) = hallmark_json(&project, &config, &args);
    assert_eq!(code, 0, "{report}");
    let rows = nodes_of(&report);
    assert_eq!(rows.len(), 6, "{report}");
    for row in &rows {
        assert_eq!(row["verified"], true, "{row}");
        // With a `[registry]` table the transport is `auto`: a first copy goes through the
        // registry where a node can pull, never to Podman (issue 40 item 3).
        if row["node"] == "node1" {
            assert_ne!(row["action"], "pulled", "{row}");
        }
    }

    // A `localhost/` name on the node for the wrapper's short name, naming another image
    // (what `podman load` of a Docker 20.10 archive or `podman tag` leaves): a client's
    // `run` of the short name gets that image, so verify and status say `mismatch`, naming
    // it, and smoke refuses (issue 42: they said `current`).
    let wrap = reference(&project, "wrap");
    let base_id = testbed.docker_ok(
        "node1",
        &[
            "image",
            "inspect",
            "--format",
            "{{.Id}}",
            &reference(&project, "base"),
        ],
    );
    testbed.docker_ok("node1", &["tag", &base_id, &format!("localhost/{wrap}")]);
    let shadowed = |report: &serde_json::Value| {
        let rows = report.as_array().unwrap();
        let row = rows
            .iter()
            .find(|r| r["image"] == "wrap" && r["node"] == "node1")
            .unwrap_or_else(|| panic!("no row of wrap on node1: {report}"));
        assert_eq!(row["state"], "mismatch", "{row}");
        let detail = row["detail"].as_str().unwrap_or_default();
        assert!(detail.contains(&format!("localhost/{wrap}")), "{row}");
    };
    let (code, report) = hallmark_json(&project, &config, &["verify", "wrap", "--nodes", "node1"]);
    assert_eq!(code, 1, "{report}");
    shadowed(&report);
    let (_, report) = hallmark_json(&project, &config, &["status"]);
    shadowed(&report);
    let smoke = project
        .with_config(&config)
        .run(&["smoke", "wrap", "--node", "node1"]);
    assert_eq!(smoke.code(), 1, "{}", smoke.stderr());

    // distribute names the shipped image so that the short name runs it (nothing to send:
    // skipped), and the image the name ran stays on the node.
    let (code, report) = hallmark_json(&project, &config, &args);
    assert_eq!(code, 0, "{report}");
    for row in nodes_of(&report) {
        assert_eq!(row["action"], "skipped", "the second distribute: {row}");
    }
    testbed.docker_ok("node1", &["image", "inspect", &base_id]);
    let mut verify = vec!["verify", "--provenance"];
    verify.extend(images);
    verify.extend(["--nodes", "node1"]);
    let (code, report) = hallmark_json(&project, &config, &verify);
    assert_eq!(code, 0, "{report}");
    for row in report.as_array().unwrap() {
        assert_eq!(row["state"], "current", "{row}");
        let detail = row["detail"].as_str().unwrap_or_default();
        assert!(detail.contains("provenance signed by"), "{row}");
    }
    let (code, report) = hallmark_json(&project, &config, &["status"]);
    assert_eq!(code, 0, "{report}");
    let text = report.to_string();
    for image in images {
        let row = report
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["image"] == image && r["node"] == "node1")
            .unwrap_or_else(|| panic!("no status row of {image} on node1: {text}"));
        assert_eq!(row["state"], "current", "{row}");
    }
    project
        .with_config(&config)
        .run(&["-q", "smoke", "wrap", "--node", "node1"])
        .success();
    testbed.run_container("node1", &wrap, &["test", "-s", "/wrap.bin"]);

    // A served smoke test (issue 39) on the Podman node: the process kept running, probed
    // inside its container over 127.0.0.1, its answer matched; and a GPU request to a node
    // with no GPU (no CDI spec) fails at once naming the node and the device (Podman's
    // Docker-compatible API would have run the test without it: hallmark asks its own API).
    let served_run = support::unique();
    project.write(
        "images/served/image.toml",
        &format!(
            "[image]\nname = \"served-{served_run}\"\n\n[from]\nimage = \"base\"\n\n[[smoke]]\nname = \"served\"\nserve = [\"sh\", \"-c\", \"mkdir -p /tmp/www && echo ok-{served_run} > /tmp/www/index.html && exec httpd -f -p 127.0.0.1:8080 -h /tmp/www\"]\nready = [\"wget\", \"-q\", \"-O\", \"/dev/null\", \"http://127.0.0.1:8080/\"]\nrun = [\"wget\", \"-q\", \"-O\", \"-\", \"http://127.0.0.1:8080/\"]\nexpect = \"ok-{served_run}\"\ntimeout = 60\nshm_size = \"64m\"\n\n[[smoke]]\nname = \"gpu\"\non = \"nodes\"\ngpus = \"all\"\nrun = [\"true\"]\n"
        ),
    );
    project
        .with_config(&config)
        .run(&["-q", "build", "served"])
        .success();
    project
        .with_config(&config)
        .run(&["-q", "distribute", "served", "--to", "node1"])
        .success();
    let smoked = project
        .with_config(&config)
        .run(&["--json", "smoke", "served", "--node", "node1"]);
    assert_eq!(smoked.code(), 1, "{}", smoked.stderr());
    let rows = support::document(&smoked.stdout());
    assert_eq!(rows[0]["name"], "served", "{rows}");
    assert_eq!(rows[0]["passed"], true, "{rows}");
    assert!(
        smoked.stderr().contains("node `node1`")
            && smoked
                .stderr()
                .contains("cannot give all GPUs: no CDI device of that name"),
        "{}",
        smoked.stderr()
    );

    // A Podman engine that freezes during a smoke test (on the container's wait, behind a
    // socket that stops answering): smoke ends within the deadlines, naming the node (issue
    // 42: no wait without a deadline, on every engine kind).
    use std::os::unix::net::{UnixListener, UnixStream};
    let spec = project.read("images/wrap/image.toml");
    project.write(
        "images/wrap/image.toml",
        &format!("{spec}\n[[smoke]]\nname = \"waits\"\nrun = [\"sleep\", \"1\"]\n"),
    );
    for verb in [
        &["-q", "build", "wrap"][..],
        &["-q", "distribute", "wrap", "--to", "node1"],
    ] {
        project.with_config(&config).run(verb).success();
    }
    let socket = project.root().join("frozen-podman.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let target = testbed.endpoint("node1");
    let target = target.strip_prefix("unix://").unwrap().to_string();
    crate::faults::freezing_proxy_either_way(
        move || listener.accept().ok().map(|(s, _)| s),
        move || UnixStream::connect(&target).ok(),
        (u64::MAX, u64::MAX),
        Some("/wait"),
    );
    let frozen = project.root().join("frozen-podman.toml");
    std::fs::write(
        &frozen,
        cluster.replace(
            &testbed.endpoint("node1"),
            &format!("unix://{}", socket.display()),
        ),
    )
    .unwrap();
    let started = std::time::Instant::now();
    let smoke = project.with_config(&frozen).run_with(
        &["smoke", "wrap", "--node", "node1"],
        &[
            ("HALLMARK_SMOKE_TIMEOUT", "10"),
            ("HALLMARK_ANSWER_TIMEOUT", "5"),
        ],
    );
    let took = started.elapsed();
    assert_eq!(smoke.code(), 1, "{}", smoke.stderr());
    assert!(smoke.stderr().contains("node1"), "{}", smoke.stderr());
    assert!(
        took < std::time::Duration::from_secs(120),
        "{took:?}: {}",
        smoke.stderr()
    );
}
