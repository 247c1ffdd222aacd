//! Issue 53: code of another platform than the builder's runs through the builder's emulator
//! (qemu-user in binfmt_misc, which `scripts/testbed install` registers), said and recorded;
//! and is refused, saying why, where emulation is off. The testbed's builder holds busybox of
//! the other common architecture (`hallmark-testbed/busybox-foreign`: arm64 on x86_64).

use crate::support::{self, TestProject, Testbed};

const FOREIGN: &str = "hallmark-testbed/busybox-foreign:latest";

/// A spec FROM the foreign busybox with a RUN step and a smoke test, and no `platform`: the
/// platform whose code runs is the parent's, and the build asks about it all the same.
#[test]
fn a_foreign_platform_build_runs_emulated_and_says_so_or_is_refused_when_emulation_is_off() {
    let testbed = Testbed::get();
    let config = testbed.config();
    let arch = testbed.docker_ok(
        "builder",
        &[
            "image",
            "inspect",
            "--format",
            "{{.Os}}/{{.Architecture}}",
            FOREIGN,
        ],
    );
    let uname = match arch.as_str() {
        "linux/arm64" => "aarch64",
        "linux/amd64" => "x86_64",
        other => panic!("unexpected foreign base {other}"),
    };
    let run = support::unique();
    let project = TestProject::new();
    project.write(
        "images/foreign/image.toml",
        &format!(
            r#"[image]
name = "foreign-{run}"

[from]
ref = "{FOREIGN}"

[build]
run = ["uname -m > /built-on"]

[[smoke]]
name = "ran as the image's platform"
run = ["cat", "/built-on"]
expect = "^{uname}"

[labels]
"test.run" = "{run}"
"#
        ),
    );
    let on = project.with_config(&config);
    on.run(&["lock", "foreign"]).success();

    let refused = on.run(&["build", "foreign", "--no-emulate"]);
    assert_eq!(refused.code(), 1, "{}", refused.stderr());
    assert!(
        refused.stderr().contains(&format!("({arch}"))
            && refused.stderr().contains("emulation is off"),
        "{}",
        refused.stderr()
    );

    let built = on.run(&["--json", "build", "foreign"]);
    assert_eq!(built.code(), 0, "{}", built.stderr());
    assert!(
        built.stderr().contains(&format!("emulated: {arch}"))
            && built.stderr().contains("builder (`builder`)"),
        "{}",
        built.stderr()
    );
    let records = support::document(&built.stdout());
    let record = &records.as_array().unwrap()[0];
    assert_eq!(record["execution"], "emulated", "{record}");
    // The parent's platform, its variant included (`linux/arm64/v8`).
    assert!(
        record["platform"]
            .as_str()
            .unwrap()
            .starts_with(arch.as_str()),
        "{record}"
    );
    assert_eq!(record["smoke"][0]["passed"], true, "{record}");
    assert_eq!(record["smoke"][0]["emulated"], true, "{record}");

    // The same image's smoke, asked again on the builder: emulated, and JUnit says so.
    let junit = project.root().join("junit.xml");
    on.run(&["smoke", "foreign", "--junit", junit.to_str().unwrap()])
        .success();
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert!(
        xml.contains("<property name=\"emulated\" value=\"true\"/>"),
        "{xml}"
    );

    // Shipped to a node of the builder's platform: sent, with a warning that it would only
    // emulate it there.
    let node = testbed.nodes()[0].clone();
    let sent = on.run(&["distribute", "foreign", "--to", &node]);
    assert_eq!(sent.code(), 0, "{}", sent.stderr());
    assert!(
        sent.stderr()
            .contains(&format!("warning: node `{node}` is linux/"))
            && sent.stderr().contains("would only emulate"),
        "{}",
        sent.stderr()
    );
}

/// An image of a platform no node can run (s390x: no probe, no emulator here) is refused by
/// every node before any byte is sent, each naming the image and both platforms.
#[test]
fn distribute_refuses_an_image_no_node_can_run_before_sending_it() {
    let testbed = Testbed::get();
    let config = testbed.config();
    let base = format!("hm-s390x-base-{}:latest", support::unique());
    support::load_labelled_base(testbed, &base, "s390x");
    let run = support::unique();
    let project = TestProject::new();
    project
        .write(
            "images/big/image.toml",
            &format!(
                "[image]\nname = \"big-{run}\"\n\n[from]\nref = \"{base}\"\n\n[[file]]\nsrc = \"m.txt\"\ndest = \"/m.txt\"\n\n[labels]\n\"test.run\" = \"{run}\"\n"
            ),
        )
        .write("images/big/m.txt", "m\n");
    let on = project.with_config(&config);
    on.run(&["lock", "big"]).success();
    // Files only: no code of its platform runs, so the builder builds it without asking.
    on.run(&["build", "big"]).success();
    let nodes = testbed.nodes();
    let sent = on.run(&["--json", "distribute", "big", "--to", &nodes.join(",")]);
    assert_eq!(sent.code(), 1, "{}", sent.stderr());
    let report = support::document(&sent.stdout());
    let rows = support::nodes_of(&report);
    for node in &nodes {
        let row = rows
            .iter()
            .find(|r| r["node"] == node.as_str())
            .unwrap_or_else(|| panic!("no row for {node}: {report}"));
        assert_eq!(row["action"], "failed", "{row}");
        let error = row["error"].to_string();
        assert!(
            error.contains("is linux/s390x and node") && error.contains("nothing was sent"),
            "{node}: {row}"
        );
        let held = testbed.docker(node, &["image", "inspect", &format!("big-{run}:latest")]);
        assert!(!held.status.success(), "{node} holds the image");
    }
}
