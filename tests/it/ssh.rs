//! ssh nodes: ssh checks host keys and hallmark never lets it learn one behind the user's
//! back; the node's engine socket is forwarded on that checked connection, or reached through
//! `docker system dial-stdio` where the node's sshd forbids socket forwarding.

use crate::support;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use support::{OwnTestbed, TestProject, Testbed, hallmark_json, ship_project};

/// The ssh node of a testbed: the last one.
fn ssh_node(testbed: &Testbed) -> String {
    testbed.env["HMTB_NODES"]
        .rsplit(',')
        .next()
        .unwrap()
        .to_string()
}

/// A copy of the testbed's cluster file whose ssh config knows only the hosts in
/// `dir/known_hosts` (written with `known_hosts`) and keeps ssh's default host-key policy
/// (the testbed's own config says `StrictHostKeyChecking yes`).
fn config_knowing(testbed: &Testbed, dir: &Path, known_hosts: &str) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let known = dir.join("known_hosts");
    std::fs::write(&known, known_hosts).unwrap();
    let ssh_config: String = std::fs::read_to_string(&testbed.env["HMTB_SSH_CONFIG"])
        .unwrap()
        .lines()
        .filter(|l| {
            let l = l.trim_start();
            !l.starts_with("StrictHostKeyChecking") && !l.starts_with("UserKnownHostsFile")
        })
        .map(|l| format!("{l}\n"))
        .collect();
    let ssh_path = dir.join("ssh_config");
    std::fs::write(
        &ssh_path,
        format!("{ssh_config}  UserKnownHostsFile {}\n", known.display()),
    )
    .unwrap();
    let cluster: String = std::fs::read_to_string(testbed.config())
        .unwrap()
        .lines()
        .map(|l| match l.starts_with("ssh-config") {
            true => format!("ssh-config = \"{}\"\n", ssh_path.display()),
            false => format!("{l}\n"),
        })
        .collect();
    let path = dir.join("hallmark.toml");
    std::fs::write(&path, cluster).unwrap();
    path
}

#[test]
fn an_unknown_or_changed_host_key_is_refused_and_never_written() {
    let testbed = Testbed::get();
    let node = ssh_node(testbed);
    let project = TestProject::new();
    let real = std::fs::read_to_string(testbed.dir.join("known_hosts")).unwrap();
    let hosts = real.split_whitespace().next().unwrap().to_string();
    // Another key under the node's names: what a man in the middle would present.
    let other = project.root().join("other_key");
    let keygen = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(&other)
        .status()
        .unwrap();
    assert!(keygen.success());
    let other_key = std::fs::read_to_string(other.with_extension("pub")).unwrap();
    let other_key = other_key
        .split_whitespace()
        .take(2)
        .collect::<Vec<_>>()
        .join(" ");

    for (case, known_hosts) in [
        ("unknown", String::new()),
        ("changed", format!("{hosts} {other_key}\n")),
    ] {
        let dir = project.root().join(case);
        let config = config_knowing(testbed, &dir, &known_hosts);
        let (code, report) = hallmark_json(&project, &config, &["nodes"]);
        assert_eq!(code, 1, "{case}: {report}");
        let row = support::row(&report, &node);
        assert_eq!(row["reachable"], false, "{case}: {row}");
        let error = row.to_string();
        assert!(
            error.contains("Host key verification failed"),
            "{case}: ssh's own reason is shown: {row}"
        );
        assert_eq!(
            std::fs::read_to_string(dir.join("known_hosts")).unwrap(),
            known_hosts,
            "{case}: known_hosts untouched"
        );
        let others: Vec<&Value> = report
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["node"] != node.as_str())
            .collect();
        assert!(
            others.iter().all(|r| r["reachable"] == true),
            "{case}: only the ssh node fails: {report}"
        );
    }
}

#[test]
fn a_node_that_forbids_socket_forwarding_is_reached_through_dial_stdio() {
    let testbed = OwnTestbed::up(&[
        "--nodes",
        "1",
        "--sshd-option",
        "AllowStreamLocalForwarding no",
    ]);
    let config = testbed.config();
    let project = ship_project(4, "dial-stdio");
    project
        .with_config(&config)
        .run(&["build", "wrap"])
        .success();
    let (code, report) = hallmark_json(&project, &config, &["distribute", "wrap"]);
    assert_eq!(code, 0, "{report}");
    let (code, report) = hallmark_json(&project, &config, &["verify", "wrap"]);
    assert_eq!(code, 0, "{report}");
    let (code, report) = hallmark_json(&project, &config, &["nodes"]);
    assert_eq!(code, 0, "{report}");
    assert_eq!(report[1]["via"], "ssh dial-stdio", "{report}");
    // The refused forward was taken back: no socket beside the master leads nowhere.
    let left: Vec<_> = std::fs::read_dir(project.root().join(".test-cache/ssh"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "engine"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    // The forward was asked for and refused by the node, so the load above went through
    // dial-stdio sessions.
    let log = std::fs::read_to_string(testbed.dir.join("ssh/sshd.log")).unwrap();
    assert!(
        log.lines()
            .any(|l| l.contains("streamlocal") && l.contains("refused")),
        "sshd refused a socket forward:\n{log}"
    );
    assert!(
        log.contains("Starting session: command"),
        "dial-stdio sessions ran:\n{log}"
    );

    // Its engine hung (dockerd stopped): `status` says unreachable, and its output ends when
    // it does. A control master holds the stderr of each dial-stdio session it carries until
    // the node's end closes, which a hung engine's never does: holding hallmark's own, it
    // kept `hallmark status | cat` waiting until the engine came back (outside test).
    let pid = testbed.env["HMTB_NODE1_PID"].clone();
    struct Resume(String);
    impl Drop for Resume {
        fn drop(&mut self) {
            let _ = std::process::Command::new("kill")
                .args(["-CONT", &self.0])
                .status();
        }
    }
    let stop = std::process::Command::new("kill")
        .args(["-STOP", &pid])
        .status();
    assert!(stop.unwrap().success());
    let _resume = Resume(pid);
    let piped = format!(
        "'{}' --config '{}' status 2>&1 | timeout 120 cat; echo \"piped: ${{PIPESTATUS[1]}}\"",
        env!("CARGO_BIN_EXE_hallmark"),
        config.display()
    );
    let output = std::process::Command::new("bash")
        .args(["-c", &piped])
        .current_dir(project.root())
        .env("HALLMARK_CACHE", project.root().join(".test-cache"))
        .env("HALLMARK_ANSWER_TIMEOUT", "5")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&output.stdout);
    assert!(said.contains("unreachable"), "{said}");
    assert!(
        said.contains("piped: 0"),
        "the pipe closed with hallmark: {said}"
    );
}

#[test]
fn a_second_command_reuses_the_engine_forward_and_starts_no_remote_session() {
    let testbed = Testbed::get();
    let node = ssh_node(testbed);
    let project = TestProject::new();
    let sessions = || {
        std::fs::read_to_string(testbed.dir.join("ssh/sshd.log"))
            .unwrap()
            .matches("Starting session")
            .count()
    };
    let reachable = |report: &Value| {
        let row = support::row(report, &node);
        row["reachable"] == true && row["via"] == "ssh forward"
    };
    let config = testbed.config();
    let (code, report) = hallmark_json(&project, &config, &["nodes"]);
    assert_eq!(code, 0, "{report}");
    assert!(reachable(&report), "{report}");
    let forwards: Vec<_> = std::fs::read_dir(project.root().join(".test-cache/ssh"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "engine"))
        .collect();
    assert_eq!(
        forwards.len(),
        1,
        "the engine socket is forwarded beside the master"
    );

    let before = sessions();
    let (code, report) = hallmark_json(&project, &config, &["nodes"]);
    assert_eq!(code, 0, "{report}");
    assert!(reachable(&report), "{report}");
    assert_eq!(
        sessions(),
        before,
        "no ssh session (dial-stdio or other) was started"
    );

    // The forward's socket removed behind the live master's back: the next command forwards
    // again (not dial-stdio), and the socket is back.
    std::fs::remove_file(forwards[0].path()).unwrap();
    let (code, report) = hallmark_json(&project, &config, &["nodes"]);
    assert_eq!(code, 0, "{report}");
    assert!(reachable(&report), "{report}");
    assert!(forwards[0].path().exists());
}
