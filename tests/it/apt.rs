//! System packages (issue 33): apt packages locked by version and sha256 against the base's
//! own archive, fetched and checked by hallmark, installed with the network off; a rebuild
//! on another engine with hallmark cut off from every network gives the same image.
//! Needs the testbed and Debian's archive (deb.debian.org), as the testbed's bases do.

use crate::support::{self, Run, TestProject, Testbed, unique};
use std::path::Path;

/// A project with one image on the testbed's Debian base that asks apt for `jq` (which
/// needs two libraries the base lacks) and runs it in a later step.
fn jq_project() -> (TestProject, String) {
    let project = TestProject::new();
    let run = unique();
    project.write(
        "images/jq/image.toml",
        &format!(
            r#"[image]
name = "hm-apt-{run}"

[from]
ref = "hallmark-testbed/python:bookworm"

[build]
apt = ["jq"]
run = ["jq --version > /jq-version"]

[labels]
"test.run" = "{run}"
"#
        ),
    );
    (project, format!("hm-apt-{run}:latest"))
}

/// `hallmark ARGS...` in a network namespace of its own (no interface but a loopback that is
/// down): the engines are reached by their unix sockets, nothing else is.
fn offline(project: &TestProject, config: &Path, args: &[&str]) -> Run {
    let output = std::process::Command::new("unshare")
        .arg("--net")
        .arg("--")
        .arg(env!("CARGO_BIN_EXE_hallmark"))
        .arg("--config")
        .arg(config)
        .args(args)
        .current_dir(project.root())
        .env("HALLMARK_CACHE", project.root().join(".test-cache"))
        .env_remove("DOCKER_HOST")
        .output()
        .unwrap();
    Run(output)
}

fn built_id(run: Run) -> String {
    let records = support::document(&run.success().stdout());
    let record = records.as_array().unwrap().last().unwrap().clone();
    assert_eq!(record["outcome"], "built", "{record}");
    record["image_id"].as_str().unwrap().to_string()
}

#[test]
fn apt_packages_are_locked_by_hash_and_installed_without_network_the_same_on_two_engines() {
    let testbed = Testbed::get();
    let (project, tag) = jq_project();
    let config = testbed.config();
    let on_builder = project.with_config(&config);

    // lock: the closure, each by archive path, size and sha256.
    on_builder.run(&["lock", "jq"]).success();
    let locked = project.read("pins/jq.toml");
    let pins: toml::Value = toml::from_str(&locked).unwrap();
    let apt = pins["apt"].as_array().unwrap();
    let names: Vec<&str> = apt.iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert!(names.contains(&"jq") && names.len() >= 3, "{names:?}");
    for pin in apt {
        assert_eq!(pin["sha256"].as_str().unwrap().len(), 64, "{pin}");
        assert!(pin["size"].as_integer().unwrap() > 0, "{pin}");
        assert!(pin["path"].as_str().unwrap().starts_with("pool/"), "{pin}");
        let wanted = pin.get("wanted").and_then(toml::Value::as_bool);
        assert_eq!(wanted.unwrap_or(false), pin["name"].as_str() == Some("jq"));
    }

    // Without its apt pins (the base still pinned), check refuses at the spec's line.
    let mut unpinned = pins.clone();
    unpinned.as_table_mut().unwrap().remove("apt");
    project.write("pins/jq.toml", &toml::to_string(&unpinned).unwrap());
    let check = on_builder.run(&["check", "jq"]);
    assert_eq!(check.code(), 2, "{}", check.stderr());
    let stderr = check.stderr();
    assert!(stderr.contains("images/jq/image.toml:8:"), "{stderr}");
    assert!(stderr.contains("apt package `jq` has no pin"), "{stderr}");
    project.write("pins/jq.toml", &locked);
    on_builder.run(&["check", "jq"]).success();

    let explain = on_builder
        .run(&["checksum", "--explain", "jq"])
        .success()
        .stdout();
    let lines = explain.lines().filter(|l| l.contains("apt ")).count();
    assert!(lines >= names.len(), "{explain}");

    // Built with the network off (the spec does not ask for it), jq runs.
    let first = built_id(on_builder.run(&["--json", "build", "jq"]));
    let version = testbed.run_container("builder", &tag, &["cat", "/jq-version"]);
    assert!(version.starts_with("jq-1."), "{version}");

    // Another engine, hallmark in a network namespace of its own: the packages come from
    // the layer store, and the image is the same.
    let other = testbed.node_of("20", "classic");
    testbed.script("load-bases", &["--node", &other]);
    let elsewhere = testbed.config_with_builder(project.root(), &other);
    let cut_off = offline(&project, &elsewhere, &["lock", "--update", "jq"]);
    assert_ne!(cut_off.code(), 0, "the namespace reaches the archive");
    assert!(
        cut_off.stderr().contains("InRelease"),
        "{}",
        cut_off.stderr()
    );
    // Without --update the pins stand as they are: nothing is asked of the archive.
    offline(&project, &elsewhere, &["lock", "jq"]).success();
    assert_eq!(project.read("pins/jq.toml"), locked);
    let second = built_id(offline(&project, &elsewhere, &["--json", "build", "jq"]));
    assert_eq!(first, second, "the same pins gave another image on {other}");

    // A package file in the store with other bytes: the build fails naming the package.
    let libonig = apt
        .iter()
        .find(|p| p["name"].as_str() == Some("libonig5"))
        .expect("jq needs libonig5");
    let stored = project
        .root()
        .join(".test-cache/store/debs")
        .join(libonig["sha256"].as_str().unwrap());
    let mut bytes = std::fs::read(&stored).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&stored, bytes).unwrap();
    let tampered = offline(&project, &elsewhere, &["build", "--force", "jq"]);
    assert_eq!(tampered.code(), 1, "{}", tampered.stderr());
    let stderr = tampered.stderr();
    assert!(stderr.contains("apt package `libonig5="), "{stderr}");
    assert!(stderr.contains("is not the pinned file"), "{stderr}");
    assert_eq!(testbed.image_id(&other, &tag), second, "the tag moved");

    // Gone from the store and the archive out of reach: named, and why.
    std::fs::remove_file(&stored).unwrap();
    let unreachable = offline(&project, &elsewhere, &["build", "--force", "jq"]);
    assert_eq!(unreachable.code(), 1, "{}", unreachable.stderr());
    let stderr = unreachable.stderr();
    assert!(stderr.contains("apt package `libonig5="), "{stderr}");
    assert!(stderr.contains("could not be reached"), "{stderr}");

    // An archive that answers other bytes for the file: named too.
    let archive = tempfile::tempdir().unwrap();
    let served = archive.path().join(libonig["path"].as_str().unwrap());
    std::fs::create_dir_all(served.parent().unwrap()).unwrap();
    std::fs::write(&served, b"not the package").unwrap();
    let mut server = std::process::Command::new("python3")
        .args(["-c", SERVER])
        .current_dir(archive.path())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut port = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(server.stdout.take().unwrap()),
        &mut port,
    )
    .unwrap();
    let moved = locked.replace(
        &format!(
            "archive = \"{}\"\npath = \"{}\"",
            libonig["archive"].as_str().unwrap(),
            libonig["path"].as_str().unwrap()
        ),
        &format!(
            "archive = \"http://127.0.0.1:{}\"\npath = \"{}\"",
            port.trim(),
            libonig["path"].as_str().unwrap()
        ),
    );
    assert_ne!(moved, locked);
    project.write("pins/jq.toml", &moved);
    let answered = on_builder.run(&["build", "--force", "jq"]);
    assert_eq!(answered.code(), 1, "{}", answered.stderr());
    let stderr = answered.stderr();
    assert!(stderr.contains("apt package `libonig5="), "{stderr}");
    assert!(stderr.contains("answered other bytes"), "{stderr}");
    // An archive that no longer serves it: where that version can still be found.
    std::fs::remove_file(&served).unwrap();
    let gone = on_builder.run(&["build", "--force", "jq"]);
    let stderr = gone.stderr();
    assert_eq!(gone.code(), 1, "{stderr}");
    assert!(stderr.contains("404"), "{stderr}");
    assert!(
        stderr.contains("snapshot.debian.org/archive/debian/"),
        "{stderr}"
    );
    server.kill().unwrap();
    server.wait().unwrap();
    project.write("pins/jq.toml", &locked);

    // prune keeps what pins name and removes what none does.
    let debs = project.root().join(".test-cache/store/debs");
    let count = || std::fs::read_dir(&debs).unwrap().count();
    let before = count();
    on_builder.run(&["prune"]).success();
    assert_eq!(count(), before, "prune removed a pinned package file");
    let spec = project.read("images/jq/image.toml");
    project.write(
        "images/jq/image.toml",
        &spec.replace(
            "apt = [\"jq\"]\nrun = [\"jq --version > /jq-version\"]\n",
            "",
        ),
    );
    on_builder.run(&["lock", "jq"]).success();
    let pruned = on_builder.run(&["prune"]).success().stderr();
    assert!(
        pruned.contains(&format!("{before} apt package files")),
        "{pruned}"
    );
    assert_eq!(count(), 0);

    let _ = testbed.docker("builder", &["rmi", &tag]);
    let _ = testbed.docker(&other, &["rmi", &tag]);
}

/// A file server on a free loopback port, which it prints first.
const SERVER: &str = "import http.server, socketserver\n\
s = socketserver.TCPServer(('127.0.0.1', 0), http.server.SimpleHTTPRequestHandler)\n\
print(s.server_address[1], flush=True)\n\
s.serve_forever()\n";

/// Pins are resolved against the image they go into: when the parent changes, `check` calls
/// them stale and `lock` resolves them again (outside test: a parent moved to newer packages
/// kept the child's pins, check said ok, and apt failed at the build).
#[test]
fn apt_pins_go_stale_with_their_parent_and_lock_resolves_them_again() {
    let testbed = Testbed::get();
    let project = TestProject::new();
    let run = unique();
    project
        .write(
            "images/par/image.toml",
            &format!(
                "[image]\nname = \"hm-apt-par-{run}\"\n\n[from]\nref = \"hallmark-testbed/python:bookworm\"\n\n[[file]]\nsrc = \"note\"\ndest = \"/etc/note\"\n"
            ),
        )
        .write("images/par/note", "one\n")
        .write(
            "images/kid/image.toml",
            &format!("[image]\nname = \"hm-apt-kid-{run}\"\n\n[from]\nimage = \"par\"\n\n[build]\napt = [\"jq\"]\n"),
        );
    let on_builder = project.with_config(testbed.config());
    // Children first on the command line: lock takes the parent first anyway.
    on_builder.run(&["lock", "kid", "par"]).success();
    on_builder.run(&["check", "kid"]).success();
    let pins = project.read("pins/kid.toml");
    assert!(
        pins.contains("[apt-against]\nbuild = \"parent par "),
        "{pins}"
    );

    project.write("images/par/note", "two\n");
    let check = on_builder.run(&["check", "kid"]);
    assert_eq!(check.code(), 2, "{}", check.stderr());
    assert!(
        check
            .stderr()
            .contains("stale: the apt packages of [build] were resolved against `parent par "),
        "{}",
        check.stderr()
    );
    let relocked = on_builder.run(&["lock", "kid"]).success().stderr();
    assert!(relocked.contains("resolved again"), "{relocked}");
    on_builder.run(&["check", "kid"]).success();
}

/// Issue 42: `lock kid` after its parent `par` changed but was not built again never reads
/// `par`'s tag (an older build that had `jq`'s libraries): it reads the image below, says so,
/// and pins what `kid` needs; the build of both then works. The tag was read, the libraries
/// were left out, and `kid`'s build failed later.
#[test]
fn lock_of_a_child_never_reads_a_parents_tag_from_an_older_build() {
    let testbed = Testbed::get();
    let project = TestProject::new();
    let run = unique();
    let par = |apt: &str| {
        format!(
            "[image]\nname = \"hm-apt-oldpar-{run}\"\n\n[from]\nref = \"hallmark-testbed/python:bookworm\"\n\n[build]\napt = [{apt}]\n\n[labels]\n\"test.run\" = \"{run}\"\n"
        )
    };
    project
        .write("images/par/image.toml", &par("\"jq\""))
        .write(
            "images/kid/image.toml",
            &format!("[image]\nname = \"hm-apt-oldkid-{run}\"\n\n[from]\nimage = \"par\"\n\n[build]\napt = [\"jq\"]\nrun = [\"jq --version\"]\n"),
        );
    let on_builder = project.with_config(testbed.config());
    on_builder.run(&["-q", "lock", "par"]).success();
    on_builder.run(&["-q", "build", "par"]).success();

    // `par` no longer installs jq; its tag still names the build that did.
    project.write("images/par/image.toml", &par(""));
    on_builder.run(&["-q", "lock", "par"]).success();
    let locked = on_builder.run(&["lock", "kid"]).success().stderr();
    assert!(
        locked.contains("`par` is not built at its current spec"),
        "{locked}"
    );
    let pins = project.read("pins/kid.toml");
    for library in ["libjq1", "libonig5"] {
        assert!(
            pins.contains(&format!("name = \"{library}\"")),
            "{library}: {pins}"
        );
    }
    on_builder.run(&["-q", "build", "kid"]).success();
    // Once `par` is built at its spec, `lock kid --update` reads it as built.
    let relocked = on_builder
        .run(&["lock", "kid", "--update"])
        .success()
        .stderr();
    assert!(
        relocked.contains("`par` as built at its current spec"),
        "{relocked}"
    );
}

/// `lock kid` when the builder removed what hallmark built of `par` at its current spec (a
/// prune): hallmark's record still names the image, and the lock says the builder no longer
/// holds it, where it read the image below in silence.
#[test]
fn lock_says_when_the_builder_removed_a_parent_built_at_its_spec() {
    let testbed = Testbed::get();
    let project = TestProject::new();
    let run = unique();
    project
        .write(
            "images/par/image.toml",
            &format!("[image]\nname = \"hm-apt-gonepar-{run}\"\n\n[from]\nref = \"hallmark-testbed/python:bookworm\"\n\n[build]\nrun = [\"echo {run} > /par\"]\n\n[labels]\n\"test.run\" = \"{run}\"\n"),
        )
        .write(
            "images/kid/image.toml",
            &format!("[image]\nname = \"hm-apt-gonekid-{run}\"\n\n[from]\nimage = \"par\"\n\n[build]\napt = [\"jq\"]\n"),
        );
    let on_builder = project.with_config(testbed.config());
    on_builder.run(&["-q", "lock", "par"]).success();
    on_builder.run(&["-q", "build", "par"]).success();
    let locked = on_builder.run(&["lock", "kid"]).success().stderr();
    assert!(
        locked.contains("`par` as built at its current spec"),
        "{locked}"
    );

    let par_id = testbed.docker_ok(
        "builder",
        &[
            "image",
            "inspect",
            "-f",
            "{{.Id}}",
            &format!("hm-apt-gonepar-{run}"),
        ],
    );
    testbed.docker_ok("builder", &["rmi", "-f", &par_id]);
    let relocked = on_builder
        .run(&["lock", "kid", "--update"])
        .success()
        .stderr();
    assert!(
        relocked.contains(
            "`par` was built at its current spec, but the builder no longer holds that image"
        ),
        "{relocked}"
    );
    assert!(
        !relocked.contains("`par` as built at its current spec"),
        "{relocked}"
    );
    assert!(project.read("pins/kid.toml").contains("name = \"jq\""));
}

/// apt on a base without Debian's files (busybox): each path the lock reads is not in the
/// image (the engine answers 404), which is no failure to read but an answer, and `lock`
/// says what the image lacks, naming the image and its base. Judged by the answer's
/// status, not its words.
#[test]
fn apt_on_a_base_without_debians_files_says_what_it_lacks() {
    let testbed = Testbed::get();
    let project = TestProject::new();
    let run = unique();
    project.write(
        "images/tiny/image.toml",
        &format!(
            r#"[image]
name = "hm-apt-tiny-{run}"

[from]
ref = "hallmark-testbed/busybox:latest"

[build]
apt = ["jq"]
run = ["true"]
"#
        ),
    );
    let lock = project.with_config(testbed.config()).run(&["lock", "tiny"]);
    assert_eq!(lock.code(), 1, "{}", lock.stderr());
    let said = lock.stderr();
    assert!(
        said.contains("image `tiny`")
            && said.contains("reading `hallmark-testbed/busybox:latest`: it has no apt source"),
        "{said}"
    );
}
