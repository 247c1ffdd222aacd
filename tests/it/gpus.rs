//! GPU requests of smoke tests on a testbed of its own whose Docker 26 and 28 and Podman nodes
//! have fake GPUs (`scripts/testbed up --fake-gpus`: a CDI spec mapping /dev/null to
//! /dev/nvidia0) and whose fourth node, a Docker 20.10 reached by ssh, has none.

use crate::support::{self, OwnTestbed, TestProject};

#[test]
fn gpu_smoke_tests_get_their_devices_and_a_node_without_them_fails_fast_named() {
    let testbed = OwnTestbed::up(&[
        "--nodes",
        "4",
        "--kind",
        "node1=26/containerd",
        "--kind",
        "node2=28/classic",
        "--kind",
        "node3=podman",
        "--fake-gpus",
        "node1,node2,node3",
    ]);
    let config = testbed.config();
    let run = support::unique();
    let project = TestProject::new();
    // A node path the served test mounts (every node of the testbed is on this machine).
    let data = project.root().join("weights");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("config.json"), format!("weights-{run}")).unwrap();
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

# A boot as the operator's: served with a GPU, the weights mounted, host IPC with a shm size
# (Podman refuses that pair unless the size is dropped), ulimits, user, environment. CDI's
# environment is the served process's (an exec'd probe does not get it on Docker).
[[smoke]]
name = "served with a gpu"
on = "nodes"
gpus = 1
serve = ["sh", "-c", "mkdir -p /tmp/www && cat /weights/config.json > /tmp/www/index.html && exec httpd -f -p 127.0.0.1:8080 -h /tmp/www"]
ready = ["wget", "-q", "-O", "/dev/null", "http://127.0.0.1:8080/"]
run = ["sh", "-c", "test -c /dev/nvidia0 && echo served=$(wget -q -O - http://127.0.0.1:8080/) env=$MODEL memlock=$(ulimit -l) uid=$(id -u) gpus=$(tr '\\0' '\\n' < /proc/1/environ | sed -n 's/^NVIDIA_VISIBLE_DEVICES=//p')"]
expect = "served=weights-{run} env=tiny memlock=64 uid=4321 gpus=0"
timeout = 60
env = {{ MODEL = "tiny" }}
mounts = [{{ source = "{data}", target = "/weights", readonly = true }}]
ipc = "host"
shm_size = "64m"
ulimits = {{ memlock = 65536, nofile = 4096, nproc = 4096 }}
user = "4321"
"#,
                data = data.display()
            ),
        )
        .write("pins/gpu.toml", crate::support::hello_pins());
    // The builder has no GPU: the tests `on` the nodes are not run there.
    project
        .with_config(&config)
        .run(&["-q", "build", "gpu"])
        .success();
    project
        .with_config(&config)
        .run(&["-q", "distribute", "gpu"])
        .success();
    for node in ["node1", "node2", "node3"] {
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
    assert_eq!(offered("node3")["cdi"], true, "{listed}");
    assert_eq!(offered("node4")["cdi"], false, "{listed}");
    assert_eq!(
        offered("node4")["gpus"].as_array().unwrap().len(),
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
        said.contains("node `node4`") && said.contains("cannot give all GPUs: no CDI"),
        "{said}"
    );
    for node in ["node1", "node2", "node3"] {
        assert!(!said.contains(&format!("node `{node}`")), "{said}");
    }
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
    let each = |node| std::iter::repeat_n(node, 3);
    let expected: Vec<_> = each("node1")
        .chain(each("node2"))
        .chain(each("node3"))
        .collect();
    assert_eq!(passed, expected, "{rows}");
    // The testbed is the test's own: any container on a node is one a smoke test left.
    for node in ["node1", "node2", "node3", "node4"] {
        let left = testbed.docker_ok(node, &["ps", "-aq"]);
        assert!(left.trim().is_empty(), "{node} kept containers: {left}");
    }
}

/// A device the node does not have fails at once on Podman too, naming the node and the device
/// (Podman's Docker-compatible API would have run the test without it).
#[test]
fn a_podman_node_without_the_named_device_fails_fast_named() {
    let testbed = OwnTestbed::up(&[
        "--nodes",
        "1",
        "--kind",
        "node1=podman",
        "--fake-gpus",
        "node1",
    ]);
    let config = testbed.config();
    let run = support::unique();
    let project = TestProject::new();
    project
        .write(
            "images/gpu/image.toml",
            &format!(
                r#"[image]
name = "gpu7-{run}"

[from]
ref = "hallmark-testbed/busybox:latest"

[[smoke]]
name = "sees gpu 7"
on = "nodes"
gpus = ["nvidia.com/gpu=7"]
run = ["test", "-c", "/dev/nvidia0"]
"#
            ),
        )
        .write("pins/gpu.toml", crate::support::hello_pins());
    project
        .with_config(&config)
        .run(&["-q", "build", "gpu"])
        .success();
    project
        .with_config(&config)
        .run(&["-q", "distribute", "gpu"])
        .success();
    let started = std::time::Instant::now();
    let out = project
        .with_config(&config)
        .run(&["smoke", "gpu", "--node", "node1"]);
    assert_eq!(out.code(), 1, "{}", out.stderr());
    let said = out.stderr();
    assert!(
        said.contains("node `node1`")
            && said.contains("cannot give nvidia.com/gpu=7: no CDI device of that name"),
        "{said}"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(120));
}
