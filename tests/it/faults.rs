//! Faults on a testbed of each test's own: the builder restarted during a build, hallmark
//! killed during a distribute, a node's disk filling during a load, ssh cut mid-stream.
//! After each: no node lost its previous image, no tag points at a half-made image, and a
//! re-run converges. Each test waits for a real sign that the work is under way (a line in
//! the build log, the node's unpack folder); none sleeps to synchronise.

use crate::support;

use serde_json::Value;
use std::path::Path;
use std::process::Command;
use support::{
    OwnTestbed, TestProject, Testbed, hallmark_json, nodes_of, reference, ship_project, spawn,
    wait_for,
};

/// hallmark in the background, its output captured.
/// A classic node is loading: its daemon unpacks the archive under `<data root>/tmp`.
fn loading(testbed: &Testbed, node: &str) -> bool {
    std::fs::read_dir(testbed.dir.join(node).join("data/tmp")).is_ok_and(|d| {
        d.flatten().any(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("docker-import-")
        })
    })
}

fn build(project: &TestProject, config: &Path, image: &str) {
    project
        .with_config(config)
        .run(&["-q", "build", image])
        .success();
}

/// Version `version` of the wrapper (its env changes, so its checksum does).
fn set_version(project: &TestProject, version: &str) {
    let spec = project.read("images/wrap/image.toml");
    let (head, _) = spec.split_once("VERSION = ").unwrap();
    let rest = spec.split_once("VERSION = ").unwrap().1;
    let rest = rest.split_once('\n').unwrap().1;
    project.write(
        "images/wrap/image.toml",
        &format!("{head}VERSION = \"{version}\"\n{rest}"),
    );
}

/// Every node holds `reference` as `expected`, or (where the new version got there) as a
/// verified copy of the new one: never anything else.
fn holds_old_or_verified_new(
    testbed: &Testbed,
    project: &TestProject,
    config: &Path,
    nodes: &[&str],
    old: &[String],
) {
    let (_, report) = hallmark_json(project, config, &["verify", "wrap"]);
    for (node, old_id) in nodes.iter().zip(old) {
        let entry = report
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["node"] == *node)
            .unwrap_or_else(|| panic!("{node} in {report}"))
            .clone();
        let id = testbed.image_id(node, &reference(project, "wrap"));
        match entry["state"].as_str().unwrap() {
            "current" => {}
            "stale" => assert_eq!(&id, old_id, "{node} holds neither version"),
            other => panic!("{node} is {other}: {entry}"),
        }
    }
}

/// A testbed of this test's own (`testbed_args`) whose nodes hold v1 of a wrapper over a
/// base of `base_mib` random MiB; returns it, the project and the wrapper's reference.
fn nodes_holding_v1(testbed_args: &[&str], base_mib: u64) -> (OwnTestbed, TestProject, String) {
    let testbed = OwnTestbed::up(testbed_args);
    let config = testbed.config();
    let project = ship_project(base_mib, "v1");
    build(&project, &config, "wrap");
    let (code, report) = hallmark_json(&project, &config, &["distribute", "wrap"]);
    assert_eq!(code, 0, "{report}");
    let wrap = reference(&project, "wrap");
    (testbed, project, wrap)
}

#[test]
fn the_builder_restarted_during_a_build_moves_no_tag_and_a_re_run_builds() {
    let testbed = OwnTestbed::up(&["--nodes", "1"]);
    let config = testbed.config();
    let project = TestProject::new();
    let run = support::unique();
    let spec = |step: &str| {
        format!(
            "[image]\nname = \"slow-{run}\"\n\n[from]\nref = \"hallmark-testbed/busybox:latest\"\n\n[build]\nrun = [\"{step}\"]\n"
        )
    };
    project
        .write("pins/slow.toml", crate::support::hello_pins())
        .write("images/slow/image.toml", &spec("echo v1 > /v"));
    build(&project, &config, "slow");
    let tag = format!("slow-{run}:latest");
    let v1 = testbed.image_id("builder", &tag);

    // v2's step never ends on its own, so the restart lands inside it however long the
    // restart takes (dockerd waits 10 s for a container that ignores SIGTERM before it kills
    // it: a step of a few seconds could finish first on a loaded machine).
    project.write(
        "images/slow/image.toml",
        &spec(&format!(
            "echo step-started-{run} && sleep 600 && echo v2 > /v"
        )),
    );
    let child = spawn(&project, &config, &["build", "slow"]);
    let logs = project.root().join(".hallmark/logs");
    wait_for("the build step start", || {
        walkdir::WalkDir::new(&logs).into_iter().flatten().any(|e| {
            std::fs::read_to_string(e.path())
                .is_ok_and(|t| t.contains(&format!("step-started-{run}")))
        })
    });
    testbed.script("restart-node", &["--node", "builder"]);
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("builder"), "names the builder: {stderr}");
    assert_eq!(
        testbed.image_id("builder", &tag),
        v1,
        "the tag did not move"
    );

    // The restarted builder builds again (the next version: v2's step would wait forever).
    project.write("images/slow/image.toml", &spec("echo v3 > /v"));
    build(&project, &config, "slow");
    let v3 = testbed.image_id("builder", &tag);
    assert_ne!(v3, v1);
    let content = testbed.run_container("builder", &tag, &["cat", "/v"]);
    assert_eq!(content, "v3");
}

#[test]
fn hallmark_killed_during_a_distribute_leaves_every_node_whole_and_a_re_run_converges() {
    let (testbed, project, wrap) = nodes_holding_v1(&["--nodes", "2"], 48);
    let config = testbed.config();
    let old = vec![
        testbed.image_id("node1", &wrap),
        testbed.image_id("node2", &wrap),
    ];

    set_version(&project, "v2");
    build(&project, &config, "wrap");
    let mut child = spawn(&project, &config, &["distribute", "wrap", "--full"]);
    wait_for("node2 loading", || loading(&testbed, "node2"));
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    holds_old_or_verified_new(&testbed, &project, &config, &["node1", "node2"], &old);

    let (code, report) = hallmark_json(&project, &config, &["distribute", "wrap"]);
    assert_eq!(code, 0, "{report}");
    for node in nodes_of(&report) {
        assert_eq!(node["verified"], true, "{node}");
    }
    let (code, _) = hallmark_json(&project, &config, &["verify", "wrap"]);
    assert_eq!(code, 0);
}

#[test]
fn a_node_whose_disk_fills_during_a_load_fails_alone_and_keeps_its_image() {
    // node2 (Docker 20.10, classic: its images live in its data root) has a 160 MiB tmpfs for
    // a data root: v1 (a few MiB) fits, v2's 192 MiB layer cannot; node1 and node3 have room.
    let (testbed, project, wrap) = nodes_holding_v1(
        &[
            "--nodes",
            "3",
            "--kind",
            "node2=20/classic",
            "--disk",
            "node2=160",
        ],
        4,
    );
    let config = testbed.config();
    let v1 = testbed.image_id("node2", &wrap);

    let spec = project.read("images/wrap/image.toml");
    project.write(
        "images/wrap/image.toml",
        &spec.replace(
            &format!("head -c {}", 4 * support::MIB),
            &format!("head -c {}", 192 * support::MIB),
        ),
    );
    set_version(&project, "v2");
    build(&project, &config, "wrap");
    let (code, report) = hallmark_json(&project, &config, &["distribute", "wrap"]);
    assert_eq!(code, 1, "{report}");
    support::assert_fails_alone(&report, "node2", None, &["no space left"]);
    assert_eq!(
        testbed.image_id("node2", &wrap),
        v1,
        "node2 kept v1 under the tag"
    );

    // Room again: the re-run finishes node2 only.
    let data = testbed.dir.join("node2/data");
    let remount = Command::new("mount")
        .args(["-o", "remount,size=1024m"])
        .arg(&data)
        .status()
        .unwrap();
    assert!(remount.success());
    support::assert_rerun_finishes_only(&project, &config, "node2", "thin");
}

#[test]
fn ssh_cut_mid_stream_fails_that_node_alone_and_a_re_run_converges() {
    let (testbed, project, wrap) = nodes_holding_v1(&["--nodes", "2"], 48);
    let config = testbed.config();
    let v1 = testbed.image_id("node2", &wrap);

    set_version(&project, "v2");
    build(&project, &config, "wrap");
    let child = spawn(
        &project,
        &config,
        &["--json", "distribute", "wrap", "--full"],
    );
    wait_for("node2 loading", || loading(&testbed, "node2"));
    // The ssh connection to node2 (its control master, in this project's cache, carries
    // every API connection): the stream is cut.
    let master = format!("^ssh: {}/.test-cache/ssh/", project.root().display());
    let killed = Command::new("pkill")
        .args(["-KILL", "-f", &master])
        .status()
        .unwrap();
    assert!(killed.success(), "an ssh master to kill");
    let output = child.wait_with_output().unwrap();
    assert_eq!(
        output.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = support::document(&String::from_utf8_lossy(&output.stdout));
    support::assert_fails_alone(&report, "node2", None, &[]);
    // The cut is the load's error, said once: not also the archive's writer blaming the layer
    // store it read from (an outside test saw that, twice).
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("stopped reading"), "{stderr}");
    // node2 was loading when the cut came: its row counts what went before it (it said 0).
    let nodes = support::nodes_of(&report);
    let node2 = nodes.iter().find(|n| n["node"] == "node2").unwrap();
    assert!(node2["archive_bytes"].as_u64().unwrap() > 0, "{node2}");
    assert!(node2["layer_bytes"].as_u64().unwrap() > 0, "{node2}");
    assert_eq!(testbed.image_id("node2", &wrap), v1, "node2 kept v1");

    support::assert_rerun_finishes_only(&project, &config, "node2", "thin");
}

/// hallmark stopped after a node took the update but before the old image was removed: the
/// re-run, which finds that node current, removes the old image there (an outside test saw it
/// left for good, on Docker 20.10 nodes), and the node that was cut off is updated and
/// cleaned as usual.
#[test]
fn a_distribute_stopped_after_a_nodes_load_removes_its_old_image_on_the_re_run() {
    // Classic nodes: an update on a containerd store leaves no old image behind.
    let classic = ["--nodes", "2", "--kind", "node1=20/classic"];
    let (testbed, project, wrap) = nodes_holding_v1(&classic, 48);
    let config = testbed.config();
    let v1: Vec<String> = ["node1", "node2"]
        .iter()
        .map(|node| testbed.image_id(node, &wrap))
        .collect();
    let held = |node: &str, id: &str| {
        testbed
            .docker(node, &["image", "inspect", id])
            .status
            .success()
    };

    set_version(&project, "v2");
    build(&project, &config, "wrap");
    // One node after another: node1 has taken v2 once node2 is loading.
    let mut child = spawn(
        &project,
        &config,
        &["--json", "distribute", "wrap", "--full"],
    );
    wait_for("node2 loading", || loading(&testbed, "node2"));
    child.kill().unwrap();
    child.wait().unwrap();
    assert_ne!(testbed.image_id("node1", &wrap), v1[0], "node1 took v2");
    assert!(held("node1", &v1[0]), "v1 left on node1 by the stop");

    let (code, report) = hallmark_json(&project, &config, &["distribute", "wrap"]);
    assert_eq!(code, 0, "{report}");
    for (node, old) in ["node1", "node2"].iter().zip(&v1) {
        assert!(
            !held(node, old),
            "{node}: v1 removed on the re-run ({report})"
        );
    }
}

/// A stream both ways, unix or TCP, for [`freezing_proxy`].
pub(crate) trait Duplex: std::io::Read + std::io::Write + Send + 'static {
    fn dup(&self) -> Self;
    fn close(&self);
}
impl Duplex for std::os::unix::net::UnixStream {
    fn dup(&self) -> Self {
        self.try_clone().unwrap()
    }
    fn close(&self) {
        let _ = self.shutdown(std::net::Shutdown::Both);
    }
}
impl Duplex for std::net::TcpStream {
    fn dup(&self) -> Self {
        self.try_clone().unwrap()
    }
    fn close(&self) {
        let _ = self.shutdown(std::net::Shutdown::Both);
    }
}

/// A proxy that passes everything both ways until one connection has carried `after` bytes
/// from its client (the archive of a load; a document is a few kilobytes), then freezes as
/// an engine or a link does for its clients: nothing more is read or written, no client's
/// connection is closed, and new ones are taken and never served. What is behind sees that
/// connection closed (so the real engine, which a healthy node of the test also reaches,
/// drops the half-sent load rather than hold it). `accept` gives the next client, `dial`
/// reaches what is behind.
fn freezing_proxy<S: Duplex>(
    accept: impl FnMut() -> Option<S> + Send + 'static,
    dial: impl Fn() -> Option<S> + Send + Sync + 'static,
    after: u64,
) {
    freezing_proxy_either_way(accept, dial, (after, u64::MAX), None);
}

/// [`freezing_proxy`], frozen once one connection has carried `after.0` bytes from its
/// client or `after.1` bytes to it (an export), or its client sends a request holding
/// `request` (which is not passed on).
pub(crate) fn freezing_proxy_either_way<S: Duplex>(
    mut accept: impl FnMut() -> Option<S> + Send + 'static,
    dial: impl Fn() -> Option<S> + Send + Sync + 'static,
    after: (u64, u64),
    request: Option<&'static str>,
) -> std::sync::Arc<std::sync::atomic::AtomicBool> {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let frozen = Arc::new(AtomicBool::new(false));
    let seen = Arc::clone(&frozen);
    let dial = Arc::new(dial);
    // A frozen side holds its sockets for good: parked, never dropped.
    fn hold<T>(_held: T) -> ! {
        loop {
            std::thread::park();
        }
    }
    std::thread::spawn(move || {
        while let Some(client) = accept() {
            let (frozen, dial) = (Arc::clone(&frozen), Arc::clone(&dial));
            std::thread::spawn(move || {
                if frozen.load(Ordering::SeqCst) {
                    hold(client);
                }
                let Some(server) = dial() else { return };
                let pipe = move |mut from: S, mut to: S, after: u64, upstream: bool| {
                    let (mut buffer, mut passed) = (vec![0u8; 1 << 14], 0u64);
                    loop {
                        if frozen.load(Ordering::SeqCst) {
                            hold((from, to));
                        }
                        let n = match from.read(&mut buffer) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        passed += n as u64;
                        let asked = upstream
                            && request
                                .is_some_and(|r| String::from_utf8_lossy(&buffer[..n]).contains(r));
                        if passed >= after || asked {
                            frozen.store(true, Ordering::SeqCst);
                            // The side behind sees its connection closed.
                            if upstream {
                                to.close()
                            } else {
                                from.close()
                            }
                            hold((from, to));
                        }
                        if to.write_all(&buffer[..n]).is_err() {
                            break;
                        }
                    }
                };
                let up = {
                    let pipe = pipe.clone();
                    let (client, server) = (client.dup(), server.dup());
                    std::thread::spawn(move || pipe(client, server, after.0, true))
                };
                pipe(server, client, after.1, false);
                let _ = up.join();
            });
        }
    });
    seen
}

/// A node whose engine freezes during a load (it stops reading the archive and never
/// answers), of every kind of the testbed: Docker 26 and 28 on containerd stores and 20.10
/// classic, each behind a unix socket that freezes, and the 20.10 node over ssh, whose link
/// freezes (a TCP proxy in front of its sshd; host keys checked as always). Each fails alone,
/// in bounded time, with why; the healthy nodes between them verify; the table's JSON prints
/// and the exit is 1. Serial and `--parallel`. An outside test saw `distribute` wait for good.
#[test]
fn a_node_that_freezes_during_a_load_fails_alone_serial_and_parallel() {
    use std::os::unix::net::{UnixListener, UnixStream};
    let testbed = Testbed::get();
    let project = ship_project(2, "frozen");
    // A base layer no node holds, even after an earlier run (the engine's build cache would
    // give the same random bytes to the same step): every frozen node gets a whole load.
    let spec = project.read("images/base/image.toml");
    let unique = format!("/base-{}.bin", support::unique());
    project.write(
        "images/base/image.toml",
        &spec.replace("/base.bin", &unique),
    );
    project
        .with_config(testbed.config())
        .run(&["-q", "build", "wrap"])
        .success();
    let ssh_config = std::fs::read_to_string(testbed.dir.join("ssh_config")).unwrap();
    // (Deadlines short for the test; the defaults are 600 s and 60 s.)
    let env = [
        ("HALLMARK_STALL_TIMEOUT", "20"),
        ("HALLMARK_ANSWER_TIMEOUT", "10"),
    ];
    for (run, image, mode) in [(1, "base", None), (2, "wrap", Some("--parallel"))] {
        let mut ssh = ssh_config.clone();
        let mut nodes = String::new();
        let mut frozen = Vec::new();
        for node in testbed.nodes() {
            let name = format!("frozen{run}-{node}");
            let endpoint = as_configured(testbed, &node);
            if let Some(target) = endpoint.strip_prefix("unix://") {
                let socket = project.root().join(format!("{name}.sock"));
                let listener = UnixListener::bind(&socket).unwrap();
                let target = target.to_string();
                freezing_proxy(
                    move || listener.accept().ok().map(|(s, _)| s),
                    move || UnixStream::connect(&target).ok(),
                    256 * 1024,
                );
                nodes.push_str(&format!(
                    "\n[[node]]\nname = \"{name}\"\nengine = \"unix://{}\"\n",
                    socket.display()
                ));
            } else {
                // The ssh node: its alias's block, reached through the proxy under the same
                // host key.
                ssh.push_str(&ssh_behind_proxy(
                    &ssh_config,
                    &endpoint,
                    &name,
                    |listener, sshd| {
                        freezing_proxy(
                            move || listener.accept().ok().map(|(s, _)| s),
                            move || std::net::TcpStream::connect(&sshd).ok(),
                            256 * 1024,
                        );
                    },
                ));
                nodes.push_str(&format!(
                    "\n[[node]]\nname = \"{name}\"\nengine = \"ssh://{name}\"\n"
                ));
            }
            // A healthy node after each frozen one: serially, it is served after the freeze.
            nodes.push_str(&format!(
                "\n[[node]]\nname = \"{node}\"\nengine = \"{endpoint}\"\n"
            ));
            frozen.push(name);
        }
        let ssh_path = project.root().join(format!("ssh_config-{run}"));
        std::fs::write(&ssh_path, ssh).unwrap();
        let builder = testbed.endpoint("builder");
        let config = project.root().join(format!("frozen-{run}.toml"));
        std::fs::write(&config, format!("ssh-config = \"{}\"\n\n[builder]\nname = \"builder\"\nengine = \"{builder}\"\n{nodes}", ssh_path.display())).unwrap();

        let mut args = vec!["distribute", image];
        args.extend(mode);
        let started = std::time::Instant::now();
        let (code, report) = support::hallmark_json_with(&project, &config, &args, &env);
        let took = started.elapsed();
        assert_eq!(code, 1, "{mode:?}: {report}");
        for row in nodes_of(&report) {
            let node = row["node"].as_str().unwrap();
            if frozen.iter().any(|f| f == node) {
                assert_eq!(row["action"], "failed", "{mode:?}: {row}");
                assert_eq!(row["verified"], false, "{mode:?}: {row}");
                let error = row["error"].as_str().unwrap();
                assert!(error.contains(node), "{mode:?}: {error}");
                // The ssh node's link is ended by ssh's keep-alives (a quarter of the answer
                // deadline each) before a stall deadline, and the error says so.
                assert!(
                    [
                        "nothing moved",
                        "no answer",
                        "timed out",
                        "Timeout",
                        "went silent"
                    ]
                    .iter()
                    .any(|w| error.contains(w)),
                    "{mode:?}: says it stalled: {error}"
                );
                assert!(
                    row["archive_bytes"].as_u64().unwrap() > 0,
                    "{mode:?}: {row}"
                );
            } else {
                assert_eq!(row["verified"], true, "{mode:?}: {row}");
            }
        }
        // Bounded: each frozen node costs its stall deadline and one answer's (30 s), plus
        // the ssh node's keepalive at worst; the work itself takes seconds. A wait for good
        // never gets here.
        eprintln!(
            "{mode:?}: distribute with {} frozen nodes took {took:?}",
            frozen.len()
        );
    }
}

/// A node's engine as the testbed's cluster file names it (`ssh://ALIAS` for the ssh node,
/// which `Testbed::endpoint` gives by its local socket).
fn as_configured(testbed: &Testbed, node: &str) -> String {
    testbed.env[&format!("HMTB_{}", node.to_uppercase())].clone()
}

/// The ssh config block of a host `name` that reaches the ssh node `endpoint`
/// (`ssh://ALIAS`) through a TCP proxy on 127.0.0.1, under the same host key: `proxy` is
/// given the listener and the sshd's address (`HOST:22`) to serve it.
fn ssh_behind_proxy(
    ssh_config: &str,
    endpoint: &str,
    name: &str,
    proxy: impl FnOnce(std::net::TcpListener, String),
) -> String {
    let alias = endpoint.strip_prefix("ssh://").unwrap();
    let block = ssh_config
        .split("Host ")
        .find(|b| b.starts_with(alias))
        .unwrap();
    let address = block
        .lines()
        .find_map(|l| l.trim().strip_prefix("HostName "))
        .unwrap();
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    proxy(listener, format!("{address}:22"));
    let options: String = block
        .lines()
        .skip(1)
        .filter(|l| !l.trim().starts_with("HostName"))
        .map(|l| format!("{l}\n"))
        .collect();
    format!("\nHost {name}\n  HostName 127.0.0.1\n  Port {port}\n  HostKeyAlias {alias}\n{options}")
}

/// Issue 42: an engine that freezes while a smoke test runs (it takes the container's wait
/// and answers nothing more, new connections included): `smoke` on the builder and on every
/// unix node kind of the testbed ends within the smoke deadline and an answer deadline for
/// the removal, naming the node; `build`'s own smoke step too, and SIGTERM there ends it as
/// interrupted (it hung 631 s, SIGTERM did nothing).
#[test]
fn an_engine_that_freezes_during_a_smoke_test_fails_it_in_bounded_time() {
    use std::os::unix::net::{UnixListener, UnixStream};
    let testbed = Testbed::get();
    let project = ship_project(1, "frozensmoke");
    let spec = project.read("images/wrap/image.toml");
    project.write(
        "images/wrap/image.toml",
        &format!("{spec}\n[[smoke]]\nname = \"waits\"\nrun = [\"sleep\", \"1\"]\n"),
    );
    project
        .with_config(testbed.config())
        .run(&["-q", "build", "wrap"])
        .success();
    project
        .with_config(testbed.config())
        .run(&["-q", "distribute", "wrap"])
        .success();
    let env = [
        ("HALLMARK_SMOKE_TIMEOUT", "10"),
        ("HALLMARK_ANSWER_TIMEOUT", "5"),
    ];
    let frozen_behind = |node: &str, name: &str| {
        let target = testbed.endpoint(node);
        let target = target.strip_prefix("unix://")?.to_string();
        let socket = project.root().join(format!("{name}.sock"));
        let listener = UnixListener::bind(&socket).unwrap();
        let frozen = freezing_proxy_either_way(
            move || listener.accept().ok().map(|(s, _)| s),
            move || UnixStream::connect(&target).ok(),
            (u64::MAX, u64::MAX),
            Some("/wait"),
        );
        Some((format!("unix://{}", socket.display()), frozen))
    };
    let builder = testbed.endpoint("builder");
    let mut frozen = Vec::new();
    for node in std::iter::once("builder".to_string()).chain(testbed.nodes()) {
        let name = format!("frozen-{node}");
        let Some((endpoint, _)) = frozen_behind(&node, &name) else {
            continue; // the ssh node: its link is another test's
        };
        // The frozen node, reached through the proxy; the builder as it is (for the record).
        let config = project.root().join(format!("{name}.toml"));
        std::fs::write(&config, format!("[builder]\nname = \"builder\"\nengine = \"{builder}\"\n\n[[node]]\nname = \"{name}\"\nengine = \"{endpoint}\"\n")).unwrap();
        let started = std::time::Instant::now();
        let mut child = spawn_with(&project, &config, &["smoke", "wrap", "--node", &name], &env);
        let (code, stderr) = ended_within(&mut child, 120);
        frozen.push(format!("{node}: {:?}", started.elapsed()));
        assert_eq!(code, Some(1), "{node}: {stderr}");
        assert!(stderr.contains(&name), "{node}: {stderr}");
        assert!(stderr.contains("no answer"), "{node}: {stderr}");
    }
    assert!(frozen.len() >= 3, "{frozen:?}");
    eprintln!("smoke on frozen engines ended after: {frozen:?}");

    // `build`'s smoke step on a builder that freezes there, then SIGTERM: interrupted, 130.
    for (signal, code) in [(None, Some(1)), (Some("TERM"), Some(130))] {
        let name = &format!("frozen-build-{}", signal.unwrap_or("none"));
        let (endpoint, frozen) = frozen_behind("builder", name).unwrap();
        let config = project.root().join(format!("frozen-build-{code:?}.toml"));
        std::fs::write(
            &config,
            format!("[builder]\nname = \"{name}\"\nengine = \"{endpoint}\"\n"),
        )
        .unwrap();
        let mut child = spawn_with(&project, &config, &["build", "wrap", "--force"], &env);
        if let Some(signal) = signal {
            wait_for("the engine frozen in the smoke step", || {
                frozen.load(std::sync::atomic::Ordering::SeqCst)
                    || child.try_wait().unwrap().is_some()
            });
            Command::new("kill")
                .args([&format!("-{signal}"), &child.id().to_string()])
                .status()
                .unwrap();
        }
        let (ended, stderr) = ended_within(&mut child, 120);
        assert_eq!(ended, code, "{signal:?}: {stderr}");
    }
}

/// [`spawn`] with these environment variables set.
fn spawn_with(
    project: &TestProject,
    config: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> std::process::Child {
    support::hallmark_at(config)
        .args(args)
        .current_dir(project.root())
        .env("HALLMARK_CACHE", project.root().join(".test-cache"))
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits up to `seconds` for `child` to end (killing it past that: the test then fails on
/// its exit code `None`); its exit code and stderr.
fn ended_within(child: &mut std::process::Child, seconds: u64) -> (Option<i32>, String) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(seconds);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let mut stderr = String::new();
    use std::io::Read as _;
    let _ = child.stderr.take().unwrap().read_to_string(&mut stderr);
    (status.and_then(|s| s.code()), stderr)
}

/// A builder whose engine freezes during the export of an image the layer store lacks (built
/// with `normalize = false`, so only the engine holds it): `distribute` fails in bounded time,
/// naming the builder and the stall, and the node keeps what it had. It waited for good.
#[test]
fn a_builder_that_freezes_during_an_export_fails_distribute_in_bounded_time() {
    use std::os::unix::net::{UnixListener, UnixStream};
    let testbed = Testbed::get();
    let project = ship_project(2, "frozen-builder");
    let spec = project.read("images/base/image.toml");
    let unique = format!("/base-{}.bin", support::unique());
    let spec = spec
        .replace("/base.bin", &unique)
        .replace("[image]\n", "[image]\nnormalize = false\n");
    project.write("images/base/image.toml", &spec);
    let shared = testbed.config();
    project
        .with_config(&shared)
        .run(&["-q", "build", "base"])
        .success();

    let socket = project.root().join("frozen-builder.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let target = testbed.endpoint("builder");
    let target = target.strip_prefix("unix://").unwrap().to_string();
    // Documents from the builder are kilobytes; the export is the image (2 MiB and more).
    freezing_proxy_either_way(
        move || listener.accept().ok().map(|(s, _)| s),
        move || UnixStream::connect(&target).ok(),
        (u64::MAX, 512 * 1024),
        None,
    );
    let config = project.root().join("frozen-builder.toml");
    std::fs::write(
        &config,
        format!(
            "[builder]\nname = \"frozen-builder\"\nengine = \"unix://{}\"\n\n[[node]]\nname = \"node1\"\nengine = \"{}\"\n",
            socket.display(),
            testbed.endpoint("node1")
        ),
    )
    .unwrap();
    let env = [
        ("HALLMARK_STALL_TIMEOUT", "20"),
        ("HALLMARK_ANSWER_TIMEOUT", "10"),
    ];
    // The table and the JSON still print (they printed nothing): the node's row is failed,
    // naming the builder and the stall.
    let (code, report) =
        support::hallmark_json_with(&project, &config, &["distribute", "base"], &env);
    assert_eq!(code, 1, "{report}");
    let row = &nodes_of(&report)[0];
    assert_eq!(row["action"], "failed", "{row}");
    let error = row["error"].as_str().unwrap();
    assert!(
        error.contains("frozen-builder"),
        "names the builder: {error}"
    );
    assert!(
        error.contains("nothing moved for 20 s"),
        "says it stalled: {error}"
    );
    let reference = reference(&project, "base");
    let held = testbed.docker("node1", &["image", "inspect", &reference]);
    assert!(!held.status.success(), "node1 holds a cut image");
}

/// Issue 42: a frozen ssh link honours the answer deadline. The ssh node's link freezes (its
/// proxy passes nothing more either way and closes nothing) while a smoke test's container
/// runs there: `smoke` ends within the smoke deadline and the answer deadline's bounds (the
/// master's keep-alives scaled to it, each session bounded), naming the node. A frozen link
/// took 104 s with a 5 s deadline.
#[test]
fn a_frozen_ssh_link_during_a_smoke_test_ends_within_the_deadlines() {
    let testbed = Testbed::get();
    let node = (testbed.nodes().into_iter())
        .find(|n| as_configured(testbed, n).starts_with("ssh://"))
        .expect("the testbed has an ssh node");
    let project = ship_project(1, "frozenlink");
    // A smoke test that holds until the test lets it go (its `sleep` killed: it then passes).
    let token = format!("held-{}", support::unique());
    let spec = project.read("images/wrap/image.toml");
    project.write(
        "images/wrap/image.toml",
        &format!(
            "{spec}\n[[smoke]]\nname = \"holds\"\nrun = [\"sh\", \"-c\", \"sleep 600 & echo $! > /tmp/held; wait; true # {token}\"]\n"
        ),
    );
    // The id of the container running that smoke test on `node`, if one is.
    let holding = |node: &str| -> Option<String> {
        let format = ["ps", "--no-trunc", "--format", "{{.ID}} {{.Command}}"];
        let listed = testbed.docker(node, &format);
        let listed = String::from_utf8_lossy(&listed.stdout).to_string();
        let line = listed.lines().find(|l| l.contains(&token))?;
        Some(line.split_whitespace().next()?.to_string())
    };
    let shared = testbed.config();
    // The build's own smoke test on the builder, let go once it holds.
    let mut build = spawn_with(&project, &shared, &["-q", "build", "wrap"], &[]);
    wait_for("the build's smoke test held, then let go", || {
        let released = holding("builder").is_some_and(|id| {
            let kill = ["exec", &id, "sh", "-c", "kill $(cat /tmp/held)"];
            testbed.docker("builder", &kill).status.success()
        });
        released || build.try_wait().unwrap().is_some()
    });
    let (code, stderr) = ended_within(&mut build, 300);
    assert_eq!(code, Some(0), "{stderr}");
    project
        .with_config(&shared)
        .run(&["-q", "distribute", "wrap", "--to", &node])
        .success();

    let ssh_config = std::fs::read_to_string(testbed.dir.join("ssh_config")).unwrap();
    let mut frozen = None;
    let alias = as_configured(testbed, &node);
    let block = ssh_behind_proxy(&ssh_config, &alias, "frozenlink", |listener, sshd| {
        frozen = Some(freezing_proxy_either_way(
            move || listener.accept().ok().map(|(s, _)| s),
            move || std::net::TcpStream::connect(&sshd).ok(),
            (u64::MAX, u64::MAX),
            None,
        ));
    });
    let frozen = frozen.unwrap();
    let ssh_path = project.root().join("ssh_config-frozenlink");
    std::fs::write(&ssh_path, format!("{ssh_config}{block}")).unwrap();
    let config = project.root().join("frozenlink.toml");
    std::fs::write(
        &config,
        format!(
            "ssh-config = \"{}\"\n\n[builder]\nname = \"builder\"\nengine = \"{}\"\n\n[[node]]\nname = \"frozenlink\"\nengine = \"ssh://frozenlink\"\n",
            ssh_path.display(),
            testbed.endpoint("builder")
        ),
    )
    .unwrap();
    let env = [
        ("HALLMARK_SMOKE_TIMEOUT", "60"),
        ("HALLMARK_ANSWER_TIMEOUT", "5"),
    ];
    let args = ["smoke", "wrap", "--node", "frozenlink"];
    let mut child = spawn_with(&project, &config, &args, &env);
    wait_for("the smoke container running on the ssh node", || {
        holding(&node).is_some() || child.try_wait().unwrap().is_some()
    });
    frozen.store(true, std::sync::atomic::Ordering::SeqCst);
    let started = std::time::Instant::now();
    // The smoke deadline (60 s) and an answer's (5 s) at most, and ssh's own slack.
    let (code, stderr) = ended_within(&mut child, 90);
    let took = started.elapsed();
    // The container the frozen link could not remove, removed here.
    if let Some(id) = holding(&node) {
        testbed.docker(&node, &["rm", "-f", &id]);
    }
    assert_eq!(code, Some(1), "{took:?}: {stderr}");
    assert!(stderr.contains("frozenlink"), "{stderr}");
    // Caught by the link's own bound (the answer deadline's scale), not by the smoke
    // deadline: the old build waited that out and more (89 s).
    assert!(
        took < std::time::Duration::from_secs(40),
        "{took:?}: {stderr}"
    );
    eprintln!("smoke over a frozen ssh link ended {took:?} after the freeze: {stderr}");
}
