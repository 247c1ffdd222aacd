//! GPU requests of smoke tests on a testbed of its own whose Docker 26 and 28 nodes have fake
//! GPUs (`scripts/testbed up --fake-gpus`: a CDI spec mapping /dev/null to /dev/nvidia0) and
//! whose third node, a Docker 20.10 reached by ssh, has none.

use crate::support::{self, OwnTestbed, TestProject};

#[test]
fn gpu_smoke_tests_get_their_devices_and_a_node_without_them_fails_fast_named() {
    let testbed = OwnTestbed::up(&[
        "--nodes",
        "3",
        "--kind",
        "node1=26/containerd",
        "--kind",
        "node2=28/classic",
        "--fake-gpus",
        "node1,node2",
    ]);
    let config = testbed.config();
    let run = support::unique();
    let project = TestProject::new();
    project
        .write(
            "images/gpu/image.toml",
            &format!(
                r#"[image]
name = "gpu-{run}"

[from]
ref = "hallmark-testbed/busybox:latest"

[[smoke]]
name = "sees every gpu"
on = "nodes"
gpus = "all"
run = ["sh", "-c", "test -c /dev/nvidia0 && echo visible=$NVIDIA_VISIBLE_DEVICES"]
expect = "visible=all"

[[smoke]]
name = "sees gpu 0"
on = "nodes"
gpus = ["nvidia.com/gpu=0"]
run = ["test", "-c", "/dev/nvidia0"]
"#
            ),
        )
        .write("pins/gpu.toml", include_str!("../../pins/hello.toml"));
    // The builder has no GPU: the tests `on` the nodes are not run there.
    project
        .with_config(&config)
        .run(&["-q", "build", "gpu"])
        .success();
    project
        .with_config(&config)
        .run(&["-q", "distribute", "gpu"])
        .success();
    for node in ["node1", "node2"] {
        project
            .with_config(&config)
            .run(&["smoke", "gpu", "--node", node])
            .success();
    }
    // `nodes` says what each offers: Docker 28 lists its CDI devices, 26 reads CDI without
    // listing them, the ssh node has none.
    let (_, listed) = support::hallmark_json(&project, &config, &["nodes"]);
    let offered = |node: &str| {
        listed
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["node"] == node)
            .unwrap_or_else(|| panic!("no row of {node}: {listed}"))
            .clone()
    };
    let node2 = offered("node2");
    assert!(
        node2["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .any(|g| g == "nvidia.com/gpu=0"),
        "{node2}"
    );
    assert_eq!(offered("node1")["cdi"], true, "{listed}");
    assert_eq!(offered("node3")["cdi"], false, "{listed}");
    assert_eq!(
        offered("node3")["gpus"].as_array().unwrap().len(),
        0,
        "{listed}"
    );
    let started = std::time::Instant::now();
    let all = project
        .with_config(&config)
        .run(&["--json", "smoke", "gpu", "--all-nodes"]);
    assert_eq!(all.code(), 1, "{}", all.stderr());
    let said = all.stderr();
    assert!(
        said.contains("node `node3`") && said.contains("cannot give all GPUs: no CDI"),
        "{said}"
    );
    assert!(
        !said.contains("node `node1`") && !said.contains("node `node2`"),
        "{said}"
    );
    // Fails at the engine's refusal, not at a deadline (the smoke deadline is 1800 s).
    assert!(started.elapsed() < std::time::Duration::from_secs(120));
    let rows = support::document(&all.stdout());
    let passed: Vec<_> = rows
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["passed"] == true)
        .map(|r| r["node"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(passed, ["node1", "node1", "node2", "node2"], "{rows}");
}
