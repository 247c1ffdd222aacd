//! A corpus of broken specs and pins: each is refused with exit 2 and an error that names
//! the file and the line or key; none panics.

mod support;

use support::{TestProject, one_line_patch};

const DIGEST: &str = "sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

fn base_pin() -> String {
    format!("[base]\nref = \"example/base:1\"\ndigest = \"{DIGEST}\"\n")
}

fn source_pin(name: &str, rev: &str, commit: &str) -> String {
    format!(
        "[[source]]\nname = \"{name}\"\ngit = \"https://example.org/{name}.git\"\nrev = \"{rev}\"\ncommit = \"{commit}\"\n"
    )
}

fn source(name: &str, dest: &str) -> String {
    format!(
        "[[source]]\nname = \"{name}\"\ngit = \"https://example.org/{name}.git\"\nrev = \"v1\"\ndest = \"{dest}\"\n"
    )
}

struct Case {
    name: &'static str,
    files: Vec<(&'static str, String)>,
    /// Every one must appear in stderr.
    expect: Vec<&'static str>,
}

fn case(name: &'static str, files: Vec<(&'static str, String)>, expect: Vec<&'static str>) -> Case {
    Case {
        name,
        files,
        expect,
    }
}

fn spec(body: &str) -> (&'static str, String) {
    ("images/bad/image.toml", body.to_string())
}

fn pins(body: &str) -> (&'static str, String) {
    ("pins/bad.toml", body.to_string())
}

const FROM: &str = "[from]\nref = \"example/base:1\"\n";

fn corpus() -> Vec<Case> {
    vec![
        case(
            "unknown key, with the valid ones",
            vec![
                spec(&format!("[image]\ntga = \"x\"\n{FROM}")),
                pins(&base_pin()),
            ],
            vec![
                "images/bad/image.toml:2:1",
                "unknown field `tga`",
                "`tag`",
                "`platform`",
            ],
        ),
        case(
            "unknown top-level table",
            vec![
                spec(&format!("{FROM}[sources]\nx = 1\n")),
                pins(&base_pin()),
            ],
            vec!["images/bad/image.toml:3", "unknown field `sources`"],
        ),
        case(
            "missing [from]",
            vec![spec("[image]\ntag = \"x\"\n")],
            vec!["images/bad/image.toml", "missing field `from`"],
        ),
        case(
            "missing field in a source",
            vec![
                spec(&format!(
                    "{FROM}[[source]]\nname = \"a\"\ngit = \"https://e.org/a.git\"\ndest = \"/a\"\n"
                )),
                pins(&base_pin()),
            ],
            vec!["images/bad/image.toml:3", "missing field `rev`"],
        ),
        case(
            "wrong type",
            vec![
                spec(&format!("[image]\ntag = 5\n{FROM}")),
                pins(&base_pin()),
            ],
            vec!["images/bad/image.toml:2:7", "tag"],
        ),
        case(
            "TOML syntax",
            vec![spec("[from\nref = 1\n")],
            vec!["images/bad/image.toml:1"],
        ),
        case(
            "both parents",
            vec![spec(
                "[from]\nref = \"example/base:1\"\nimage = \"other\"\n",
            )],
            vec!["images/bad/image.toml:1", "exactly one parent"],
        ),
        case(
            "no parent",
            vec![spec("[from]\n")],
            vec!["images/bad/image.toml:1", "exactly one parent"],
        ),
        case(
            "a digest in the spec's ref",
            vec![spec(&format!("[from]\nref = \"example/base@{DIGEST}\"\n"))],
            vec!["images/bad/image.toml", "from.ref", "belongs in pins/"],
        ),
        case(
            "bad commit in pins",
            vec![
                spec(&format!("{FROM}{}", source("a", "/a"))),
                pins(&format!("{}{}", base_pin(), source_pin("a", "v1", "12345"))),
            ],
            vec!["pins/bad.toml:8", "`12345` is not a commit"],
        ),
        case(
            "a branch as the pin",
            vec![
                spec(&format!("{FROM}{}", source("a", "/a"))),
                pins(&format!("{}{}", base_pin(), source_pin("a", "v1", "main"))),
            ],
            vec![
                "pins/bad.toml:8",
                "`main` is not a commit",
                "a branch or tag",
            ],
        ),
        case(
            "malformed digest in pins",
            vec![
                spec(FROM),
                pins("[base]\nref = \"example/base:1\"\ndigest = \"sha256:xyz\"\n"),
            ],
            vec!["pins/bad.toml:3", "is not a digest"],
        ),
        case(
            "unknown key in pins",
            vec![spec(FROM), pins(&format!("{}tag = \"x\"\n", base_pin()))],
            vec!["pins/bad.toml:4", "unknown field `tag`"],
        ),
        case(
            "base without a pin",
            vec![spec(FROM)],
            vec!["pins/bad.toml", "no digest pinned", "hallmark lock bad"],
        ),
        case(
            "stale source pin",
            vec![
                spec(&format!("{FROM}{}", source("a", "/a"))),
                pins(&format!("{}{}", base_pin(), source_pin("a", "v0", COMMIT))),
            ],
            vec!["pins/bad.toml", "stale", "`v0`", "hallmark lock bad"],
        ),
        case(
            "wheel without a pin",
            vec![
                spec(&format!(
                    "{FROM}[[wheel]]\nname = \"b12x\"\nversion = \"1.3.0\"\n"
                )),
                pins(&base_pin()),
            ],
            vec![
                "pins/bad.toml",
                "no sha256 pinned for wheel `b12x`",
                "hallmark lock bad",
            ],
        ),
        case(
            "wheel version range",
            vec![
                spec(&format!(
                    "{FROM}[[wheel]]\nname = \"b12x\"\nversion = \">=1.3\"\n"
                )),
                pins(&base_pin()),
            ],
            vec!["images/bad/image.toml:4", "wheel.version", "exact version"],
        ),
        case(
            "duplicate source names",
            vec![
                spec(&format!("{FROM}{}{}", source("a", "/a"), source("a", "/b"))),
                pins(&format!("{}{}", base_pin(), source_pin("a", "v1", COMMIT))),
            ],
            vec!["images/bad/image.toml:9:8", "named twice"],
        ),
        case(
            "dest escaping with ..",
            vec![
                spec(&format!("{FROM}{}", source("a", "/workspace/../etc"))),
                pins(&base_pin()),
            ],
            vec!["images/bad/image.toml:7", "escapes with `..`"],
        ),
        case(
            "relative dest",
            vec![
                spec(&format!("{FROM}{}", source("a", "workspace"))),
                pins(&base_pin()),
            ],
            vec!["images/bad/image.toml:7", "absolute path"],
        ),
        case(
            "file source escaping the spec folder",
            vec![
                spec(&format!(
                    "{FROM}[[file]]\nsrc = \"../../pins/x\"\ndest = \"/x\"\n"
                )),
                pins(&base_pin()),
            ],
            vec!["images/bad/image.toml:4", "escapes with `..`"],
        ),
        case(
            "nested source listed before its container",
            vec![
                spec(&format!(
                    "{FROM}{}{}",
                    source("cutlass", "/w/vllm/build/_deps/cutlass-src"),
                    source("vllm", "/w/vllm")
                )),
                pins(&format!(
                    "{}{}{}",
                    base_pin(),
                    source_pin("cutlass", "v1", COMMIT),
                    source_pin("vllm", "v1", COMMIT)
                )),
            ],
            vec!["images/bad/image.toml:7", "list the outer source first"],
        ),
        case(
            "missing patch file",
            vec![
                spec(&format!("{FROM}{}patches = [\"set\"]\n", source("a", "/a"))),
                pins(&format!("{}{}", base_pin(), source_pin("a", "v1", COMMIT))),
                (
                    "patches/set/series",
                    "0001-a.patch\n0002-gone.patch\n".into(),
                ),
                ("patches/set/0001-a.patch", one_line_patch("x", "a", "b")),
            ],
            vec!["patches/set/series:2", "0002-gone.patch"],
        ),
        case(
            "missing patch set",
            vec![
                spec(&format!(
                    "{FROM}{}patches = [\"nope\"]\n",
                    source("a", "/a")
                )),
                pins(&format!("{}{}", base_pin(), source_pin("a", "v1", COMMIT))),
            ],
            vec![
                "images/bad/image.toml:8",
                "patch set `nope` has no series file",
            ],
        ),
        case(
            "missing file source",
            vec![
                spec(&format!(
                    "{FROM}\n[[file]]\nsrc = \"gone\"\ndest = \"/opt/gone\"\n"
                )),
                pins(&base_pin()),
            ],
            vec!["images/bad/image.toml:", "gone does not exist"],
        ),
        case(
            "series entry escaping the set",
            vec![
                spec(&format!("{FROM}{}patches = [\"set\"]\n", source("a", "/a"))),
                pins(&format!("{}{}", base_pin(), source_pin("a", "v1", COMMIT))),
                ("patches/set/series", "../../images/bad/image.toml\n".into()),
            ],
            vec!["patches/set/series:1", "escapes with `..`"],
        ),
        case(
            "patch touching a path outside the source",
            vec![
                spec(&format!("{FROM}{}patches = [\"set\"]\n", source("a", "/a"))),
                pins(&format!("{}{}", base_pin(), source_pin("a", "v1", COMMIT))),
                ("patches/set/series", "0001-evil.patch\n".into()),
                (
                    "patches/set/0001-evil.patch",
                    one_line_patch("../../etc/passwd", "a", "b"),
                ),
            ],
            vec!["patches/set/0001-evil.patch", "outside the source tree"],
        ),
        case(
            "parent cycle",
            vec![
                spec("[from]\nimage = \"loop\"\n"),
                ("images/loop/image.toml", "[from]\nimage = \"bad\"\n".into()),
            ],
            vec!["cycle", "bad -> loop -> bad"],
        ),
        case(
            "unknown parent",
            vec![spec("[from]\nimage = \"nowhere\"\n")],
            vec!["images/bad/image.toml:1", "no image `nowhere`"],
        ),
        case(
            "invalid env name",
            vec![
                spec(&format!("{FROM}[env]\n\"A-B\" = \"1\"\n")),
                pins(&base_pin()),
            ],
            vec!["images/bad/image.toml:4", "env.A-B"],
        ),
        case(
            "invalid tag",
            vec![
                spec(&format!("[image]\ntag = \"v 1\"\n{FROM}")),
                pins(&base_pin()),
            ],
            vec!["images/bad/image.toml:2:7", "`v 1` is not a valid tag"],
        ),
        case(
            "invalid apt package",
            vec![
                spec(&format!(
                    "{FROM}[build]\nnetwork = true\napt = [\"curl\", \"Bad Name\"]\n"
                )),
                pins(&base_pin()),
            ],
            vec![
                "images/bad/image.toml:5:16",
                "`Bad Name` is not a package name",
            ],
        ),
        case(
            "invalid label key",
            vec![
                spec(&format!("{FROM}[labels]\n\"a=b\" = \"x\"\n")),
                pins(&base_pin()),
            ],
            vec!["images/bad/image.toml:4", "`a=b` is not a label key"],
        ),
        case(
            "empty smoke command",
            vec![
                spec(&format!("{FROM}[[smoke]]\nname = \"s\"\nrun = []\n")),
                pins(&base_pin()),
            ],
            vec!["images/bad/image.toml:4", "smoke.run"],
        ),
        case(
            "wheel pin naming another file",
            vec![
                spec(&format!(
                    "{FROM}[[wheel]]\nname = \"b12x\"\nversion = \"1.3.0\"\n"
                )),
                pins(&format!(
                    "{}[[wheel]]\nname = \"b12x\"\nversion = \"1.3.0\"\nfile = \"../evil.whl\"\nsha256 = \"{}\"\n",
                    base_pin(),
                    "c".repeat(64)
                )),
            ],
            vec!["pins/bad.toml:7:8", "wheel.file"],
        ),
    ]
}

#[test]
fn every_malformed_input_exits_2_naming_file_and_place() {
    let cases = corpus();
    assert!(cases.len() >= 15);
    let mut failures = Vec::new();
    for case in cases {
        let project = TestProject::new();
        for (path, text) in &case.files {
            project.write(path, text);
        }
        for command in [
            &["checksum", "bad"][..],
            &["check", "bad"],
            &["render", "bad"],
        ] {
            let run = project.run(command);
            let stderr = run.stderr();
            let missing: Vec<_> = case
                .expect
                .iter()
                .filter(|e| !stderr.contains(*e))
                .collect();
            if run.code() != 2 || !missing.is_empty() || stderr.contains("panicked") {
                failures.push(format!(
                    "{} ({command:?}): exit {}, missing {missing:?}\n{stderr}",
                    case.name,
                    run.code()
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n---\n"));
}

#[test]
fn a_missing_cluster_file_is_bad_usage() {
    let project = TestProject::new();
    project
        .write("images/ok/image.toml", "[from]\nimage = \"ok2\"\n")
        .write("images/ok2/image.toml", "[from]\nref = \"x:1\"\n");
    let run = project.run(&["--config", "/nonexistent/hallmark.toml", "nodes"]);
    assert_eq!(run.code(), 2, "{}", run.stderr());
    assert!(
        run.stderr()
            .contains("/nonexistent/hallmark.toml does not exist"),
        "{}",
        run.stderr()
    );
}

#[test]
fn an_unknown_key_in_the_cluster_file_names_it() {
    let project = TestProject::new();
    project
        .write("images/ok/image.toml", "[from]\nref = \"x:1\"\n")
        .write(
            "hallmark.toml",
            "[builder]\nname = \"b\"\nengin = \"unix:///x\"\n",
        );
    let run = project.run(&["nodes"]);
    assert_eq!(run.code(), 2, "{}", run.stderr());
    assert!(
        run.stderr().contains("hallmark.toml:3:1")
            && run.stderr().contains("unknown field `engin`"),
        "{}",
        run.stderr()
    );
}

#[test]
fn a_bad_transport_or_registry_setting_names_its_key() {
    let cases = [
        (
            "transport = \"carrier-pigeon\"\n",
            "hallmark.toml:1",
            "carrier-pigeon",
        ),
        (
            "transport = \"registry\"\n[registry]\naddress = \"http://reg/\"\n",
            "registry.address",
            "not host:port",
        ),
        ("[registry]\npulls = 0\n", "registry.pulls", "at least 1"),
        (
            "[[node]]\nname = \"n\"\nengine = \"unix:///x\"\ntransport = \"ftp\"\n",
            "hallmark.toml:4",
            "ftp",
        ),
    ];
    for (text, key, message) in cases {
        let project = TestProject::new();
        project
            .write("images/ok/image.toml", "[from]\nref = \"x:1\"\n")
            .write("hallmark.toml", text);
        let run = project.run(&["nodes"]);
        assert_eq!(run.code(), 2, "{text}: {}", run.stderr());
        assert!(
            run.stderr().contains(key) && run.stderr().contains(message),
            "{text}: {}",
            run.stderr()
        );
    }
}
