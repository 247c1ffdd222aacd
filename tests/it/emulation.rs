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
}
