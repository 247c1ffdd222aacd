//! A corpus of broken specs and pins: each is refused with exit 2 and an error that names
//! the file and the line or key; none panics.

use crate::support;

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
            "the digest algorithm as the image name",
            vec![
                spec(&format!("[image]\nname = \"sha256\"\n{FROM}")),
                pins(&base_pin()),
            ],
            vec!["images/bad/image.toml", "`image.name`", "sha256"],
        ),
        case(
            "a smoke test with a blank name",
            vec![
                spec(&format!(
                    "{FROM}\n[[smoke]]\nname = \" \"\nrun = [\"true\"]\n"
                )),
                pins(&base_pin()),
            ],
            vec!["images/bad/image.toml:5", "`smoke.name`", "blank"],
        ),
        case(
            "a smoke test whose program is blank",
            vec![
                spec(&format!("{FROM}\n[[smoke]]\nname = \"x\"\nrun = [\"\"]\n")),
                pins(&base_pin()),
            ],
            vec!["images/bad/image.toml:5", "`smoke.run`", "blank program"],
        ),
        case(
            "a smoke probe without serve",
            vec![
                spec(&format!(
                    "{FROM}\n[[smoke]]\nname = \"x\"\nrun = [\"true\"]\nready = [\"true\"]\n"
                )),
                pins(&base_pin()),
            ],
            vec!["images/bad/image.toml", "`smoke.ready`", "needs `serve`"],
        ),
        case(
            "smoke args with a serve argv",
            vec![
                spec(&format!(
                    "{FROM}\n[[smoke]]\nname = \"x\"\nrun = [\"true\"]\nserve = [\"sleep\", \"9\"]\nargs = [\"x\"]\n"
                )),
                pins(&base_pin()),
            ],
            vec!["images/bad/image.toml", "`smoke.args`", "serve = true"],
        ),
        case(
            "a smoke expect that is no regex",
            vec![
                spec(&format!(
                    "{FROM}\n[[smoke]]\nname = \"x\"\nrun = [\"true\"]\nexpect = \"(unclosed\"\n"
                )),
                pins(&base_pin()),
            ],
            vec![
                "images/bad/image.toml",
                "`smoke.expect`",
                "no regular expression",
            ],
        ),
        case(
            "a smoke shm size that is no size",
            vec![
                spec(&format!(
                    "{FROM}\n[[smoke]]\nname = \"x\"\nrun = [\"true\"]\nshm_size = \"lots\"\n"
                )),
                pins(&base_pin()),
            ],
            vec!["images/bad/image.toml", "`smoke.shm_size`", "no size"],
        ),
        case(
            "a smoke ipc mode that is none",
            vec![
                spec(&format!(
                    "{FROM}\n[[smoke]]\nname = \"x\"\nrun = [\"true\"]\nipc = \"sideways\"\n"
                )),
                pins(&base_pin()),
            ],
            vec!["images/bad/image.toml", "`smoke.ipc`", "`host`"],
        ),
        case(
            "a smoke mount with a relative path",
            vec![
                spec(&format!(
                    "{FROM}\n[[smoke]]\nname = \"x\"\nrun = [\"true\"]\nmounts = [{{ source = \"weights\", target = \"/w\" }}]\n"
                )),
                pins(&base_pin()),
            ],
            vec!["images/bad/image.toml", "`smoke.mounts`", "absolute"],
        ),
        case(
            "a smoke timeout of the wrong type",
            vec![
                spec(&format!(
                    "{FROM}\n[[smoke]]\nname = \"x\"\nrun = [\"true\"]\ntimeout = \"soon\"\n"
                )),
                pins(&base_pin()),
            ],
            vec!["images/bad/image.toml", "image.toml:7", "timeout"],
        ),
        case(
            "a smoke timeout past a week",
            vec![
                spec(&format!(
                    "{FROM}\n[[smoke]]\nname = \"x\"\nrun = [\"true\"]\nserve = true\ntimeout = 18446744073709551615\n"
                )),
                pins(&base_pin()),
            ],
            vec!["images/bad/image.toml", "timeout"],
        ),
        case(
            "a smoke timeout on a test that serves nothing",
            vec![
                spec(&format!(
                    "{FROM}\n[[smoke]]\nname = \"x\"\nrun = [\"true\"]\ntimeout = 60\n"
                )),
                pins(&base_pin()),
            ],
            vec![
                "images/bad/image.toml:7",
                "`smoke.timeout`",
                "serves none",
                "HALLMARK_SMOKE_TIMEOUT",
            ],
        ),
        case(
            "a smoke env name an engine refuses",
            vec![
                spec(&format!(
                    "{FROM}\n[[smoke]]\nname = \"x\"\nrun = [\"true\"]\nenv = {{ \"A=B\" = \"1\" }}\n"
                )),
                pins(&base_pin()),
            ],
            vec!["images/bad/image.toml:5", "`smoke.env`", "`A=B`"],
        ),
        case(
            "a smoke ulimit no engine knows",
            vec![
                spec(&format!(
                    "{FROM}\n[[smoke]]\nname = \"x\"\nrun = [\"true\"]\nulimits = {{ memlok = -1 }}\n"
                )),
                pins(&base_pin()),
            ],
            vec![
                "images/bad/image.toml:5",
                "`smoke.ulimits`",
                "`memlok`",
                "memlock",
            ],
        ),
        case(
            "a smoke gpus value of no accepted form",
            vec![
                spec(&format!(
                    "{FROM}\n[[smoke]]\nname = \"x\"\nrun = [\"true\"]\ngpus = 1.5\n"
                )),
                pins(&base_pin()),
            ],
            vec![
                "images/bad/image.toml:7",
                "gpus",
                "a count of GPUs",
                "CDI device names",
            ],
        ),
        case(
            "a smoke serve value of no accepted form",
            vec![
                spec(&format!(
                    "{FROM}\n[[smoke]]\nname = \"x\"\nrun = [\"true\"]\nserve = \"yes\"\n"
                )),
                pins(&base_pin()),
            ],
            vec!["images/bad/image.toml:7", "serve", "`true`"],
        ),
        case(
            "an unknown smoke key",
            vec![
                spec(&format!(
                    "{FROM}\n[[smoke]]\nname = \"x\"\nrun = [\"true\"]\ngpu = \"all\"\n"
                )),
                pins(&base_pin()),
            ],
            vec!["images/bad/image.toml", "image.toml:7", "gpu"],
        ),
        case(
            "an entrypoint whose program is blank",
            vec![
                spec(&format!("{FROM}\n[container]\nentrypoint = [\"\"]\n")),
                pins(&base_pin()),
            ],
            vec![
                "images/bad/image.toml",
                "`container.entrypoint`",
                "blank program",
            ],
        ),
        case(
            "two specs for one image name and tag",
            vec![
                spec(&format!("[image]\nname = \"twin\"\ntag = \"1\"\n{FROM}")),
                pins(&base_pin()),
                (
                    "images/other/image.toml",
                    format!("[image]\nname = \"twin\"\ntag = \"1\"\n{FROM}"),
                ),
                ("pins/other.toml", base_pin()),
            ],
            vec!["images/bad/image.toml", "images/other/image.toml", "twin:1"],
        ),
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
            "bad image reference in pins",
            vec![
                spec(FROM),
                pins(&format!(
                    "[base]\nref = \"Example/base:1\"\ndigest = \"{DIGEST}\"\n"
                )),
            ],
            vec!["pins/bad.toml:2", "ref", "`Example` must be lowercase"],
        ),
        case(
            "bad tag in a pinned reference",
            vec![
                spec(FROM),
                pins(&format!(
                    "[base]\nref = \"example/base:-1\"\ndigest = \"{DIGEST}\"\n"
                )),
            ],
            vec!["pins/bad.toml:2", "ref", "`-1` is not a valid tag"],
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
            "repository ending in a dash",
            vec![
                spec(&format!("[image]\nname = \"app-\"\n{FROM}")),
                pins(&base_pin()),
            ],
            vec![
                "images/bad/image.toml:2:8",
                "`app-` is not a valid repository name",
            ],
        ),
        case(
            "repository with a double dot",
            vec![
                spec(&format!("[image]\nname = \"a..b\"\n{FROM}")),
                pins(&base_pin()),
            ],
            vec![
                "images/bad/image.toml:2:8",
                "`a..b` is not a valid repository",
            ],
        ),
        case(
            "tag starting with a dash",
            vec![
                spec(&format!("[image]\ntag = \"-x\"\n{FROM}")),
                pins(&base_pin()),
            ],
            vec!["images/bad/image.toml:2:7", "`-x` is not a valid tag"],
        ),
        case(
            "tag starting with a dot",
            vec![
                spec(&format!("[image]\ntag = \".x\"\n{FROM}")),
                pins(&base_pin()),
            ],
            vec!["images/bad/image.toml:2:7", "`.x` is not a valid tag"],
        ),
        case(
            "tag longer than 128",
            vec![
                spec(&format!("[image]\ntag = \"{}\"\n{FROM}", "t".repeat(129))),
                pins(&base_pin()),
            ],
            vec!["images/bad/image.toml:2:7", "is not a valid tag"],
        ),
        case(
            "external parent with capitals",
            vec![spec("[from]\nref = \"Example/base:1\"\n")],
            vec![
                "images/bad/image.toml:1",
                "from.ref",
                "`Example` must be lowercase",
            ],
        ),
        case(
            "external parent with a bad tag",
            vec![spec("[from]\nref = \"example/base:-1\"\n")],
            vec![
                "images/bad/image.toml:1",
                "from.ref",
                "`-1` is not a valid tag",
            ],
        ),
        case(
            "blank run step",
            vec![
                spec(&format!("{FROM}[build]\nrun = [\"true\", \"  \"]\n")),
                pins(&base_pin()),
            ],
            vec!["images/bad/image.toml:4:16", "build.run", "blank"],
        ),
        case(
            "a file inside a file",
            vec![
                spec(&format!(
                    "{FROM}[[file]]\nsrc = \"a\"\ndest = \"/opt/a\"\n[[file]]\nsrc = \"b\"\ndest = \"/opt/a/b\"\n"
                )),
                pins(&base_pin()),
                ("images/bad/a", "a".into()),
                ("images/bad/b", "b".into()),
            ],
            vec![
                "images/bad/image.toml:8:8",
                "`/opt/a/b` would lie inside `/opt/a`, which is a file",
            ],
        ),
        case(
            "a folder's file where a file is copied too",
            vec![
                spec(&format!(
                    "{FROM}[[file]]\nsrc = \"dir\"\ndest = \"/opt\"\n[[file]]\nsrc = \"b\"\ndest = \"/opt/b\"\n"
                )),
                pins(&base_pin()),
                ("images/bad/dir/b", "a".into()),
                ("images/bad/b", "b".into()),
            ],
            vec!["images/bad/image.toml:8:8", "two files land at `/opt/b`"],
        ),
        case(
            "a whiteout name in a copied folder",
            vec![
                spec(&format!("{FROM}[[file]]\nsrc = \"dir\"\ndest = \"/opt\"\n")),
                pins(&base_pin()),
                ("images/bad/dir/.wh.passwd", "x".into()),
            ],
            vec![
                "images/bad/image.toml:5:8",
                "`.wh.passwd` would delete `passwd`",
            ],
        ),
        case(
            "an empty file src",
            vec![
                spec(&format!(
                    "{FROM}[[file]]\nsrc = \"\"\ndest = \"/opt/all\"\n"
                )),
                pins(&base_pin()),
            ],
            vec!["images/bad/image.toml:4:7", "empty"],
        ),
        case(
            "source date past what engines keep",
            vec![
                spec(&format!("[image]\nsource-date-epoch = 9223372037\n{FROM}")),
                pins(&base_pin()),
            ],
            vec![
                "images/bad/image.toml:2:21",
                "image.source-date-epoch",
                "9223372036",
            ],
        ),
        case(
            "negative source date",
            vec![
                spec(&format!("[image]\nsource-date-epoch = -1\n{FROM}")),
                pins(&base_pin()),
            ],
            vec!["images/bad/image.toml:2:21"],
        ),
        case(
            "env value with a line break",
            vec![
                spec(&format!("{FROM}[env]\nA = \"x\\ny\"\n")),
                pins(&base_pin()),
            ],
            vec!["images/bad/image.toml:4:5", "env.A", "control character"],
        ),
        case(
            "label value with a carriage return",
            vec![
                spec(&format!("{FROM}[labels]\n\"a.b\" = \"x\\ry\"\n")),
                pins(&base_pin()),
            ],
            vec![
                "images/bad/image.toml:4:9",
                "labels.a.b",
                "control character",
            ],
        ),
        case(
            "build arg with an escape character",
            vec![
                spec(&format!("{FROM}[build.args]\nA = \"\\u001b[31m\"\n")),
                pins(&base_pin()),
            ],
            vec![
                "images/bad/image.toml:4:5",
                "build.args.A",
                "control character",
            ],
        ),
        case(
            "apt package starting with a dash",
            vec![
                spec(&format!(
                    "{FROM}[build]\nnetwork = true\napt = [\"--allow-unauthenticated\"]\n"
                )),
                pins(&base_pin()),
            ],
            vec!["images/bad/image.toml:5:8", "is not a package name"],
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

/// The whole error report, caret layout included, of every case: a change to what a user
/// reads shows up as a snapshot diff (tests/it/snapshots/it__malformed__every_malformed_error.snap).
#[test]
fn every_malformed_error_reads_exactly_as_snapshotted() {
    let mut report = String::new();
    for case in corpus() {
        let project = TestProject::new();
        for (path, text) in &case.files {
            project.write(path, text);
        }
        let run = project.run(&["check", "bad"]);
        report.push_str(&format!(
            "## {} (exit {})\n{}\n",
            case.name,
            run.code(),
            support::without_root(&project, &run.stderr())
        ));
    }
    insta::assert_snapshot!("every_malformed_error", report);
}

/// One report of several runs, for a snapshot: `## heading` and what the user read; runs in a
/// row that read the same are one entry under their headings joined by ` | `.
fn report(runs: Vec<(String, String)>) -> String {
    let mut merged: Vec<(Vec<String>, String)> = Vec::new();
    for (heading, said) in runs {
        match merged.last_mut() {
            Some((headings, last)) if *last == said => headings.push(heading),
            _ => merged.push((vec![heading], said)),
        }
    }
    merged
        .iter()
        .map(|(headings, said)| format!("## {}\n{said}\n", headings.join(" | ")))
        .collect()
}

#[test]
fn a_missing_cluster_file_is_bad_usage() {
    let project = TestProject::new();
    project
        .write("images/ok/image.toml", "[from]\nimage = \"ok2\"\n")
        .write("images/ok2/image.toml", "[from]\nref = \"x:1\"\n");
    let run = project
        .with_config("/nonexistent/hallmark.toml")
        .run(&["nodes"]);
    assert_eq!(run.code(), 2, "{}", run.stderr());
    insta::assert_snapshot!(
        "a_missing_cluster_file",
        support::transcript(&project, &run)
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
    insta::assert_snapshot!(
        "an_unknown_key_in_the_cluster_file",
        support::transcript(&project, &run)
    );
}

#[test]
fn a_bad_transport_or_registry_setting_names_its_key() {
    let cases = [
        "transport = \"carrier-pigeon\"\n",
        "transport = \"registry\"\n[registry]\naddress = \"http://reg/\"\n",
        "[registry]\npulls = 0\n",
        "[registry]\nport = 0\n",
        "[[node]]\nname = \"n\"\nengine = \"unix:///x\"\ntransport = \"ftp\"\n",
    ];
    let mut runs = Vec::new();
    for text in cases {
        let project = TestProject::new();
        project
            .write("images/ok/image.toml", "[from]\nref = \"x:1\"\n")
            .write("hallmark.toml", text);
        let run = project.run(&["nodes"]);
        assert_eq!(run.code(), 2, "{text}: {}", run.stderr());
        runs.push((format!("{text:?}"), support::transcript(&project, &run)));
    }
    insta::assert_snapshot!("a_bad_transport_or_registry_setting", report(runs));
}

/// Issue 17: an engine address is parsed once, where hallmark reads it; one it cannot use is
/// bad input (exit 2) naming the node and where the address came from, for any command.
#[test]
fn a_bad_engine_address_names_its_node_and_where_it_came_from() {
    let cases = [
        "[[node]]\nname = \"n1\"\nengine = \"npipe:////./pipe/docker_engine\"\n",
        "[builder]\nname = \"b\"\nengine = \"tcp://\"\n",
        "[builder]\nname = \"b\"\nengine = \"unix:///x.sock\"\n[[node]]\nname = \"s\"\nengine = \"ssh://\"\n",
    ];
    let mut runs = Vec::new();
    for text in cases {
        let project = TestProject::new();
        project
            .write("images/ok/image.toml", "[from]\nref = \"x:1\"\n")
            .write("hallmark.toml", text);
        let run = project.run(&["nodes"]);
        assert_eq!(run.code(), 2, "{text}: {}", run.stderr());
        runs.push((format!("{text:?}"), support::transcript(&project, &run)));
    }
    insta::assert_snapshot!("a_bad_engine_address", report(runs));
    // Without a cluster file, the engine the docker CLI would use: a DOCKER_HOST hallmark
    // cannot use is refused before any work, offline commands too.
    let project = TestProject::new();
    project.write("images/ok/image.toml", "[from]\nref = \"x:1\"\n");
    let config = tempfile::tempdir().unwrap();
    for command in [&["--json", "nodes"][..], &["checksum", "ok"]] {
        let output = support::hallmark()
            .args(command)
            .current_dir(project.root())
            .env("HALLMARK_CACHE", project.root().join(".test-cache"))
            .env("DOCKER_CONFIG", config.path())
            .env("DOCKER_HOST", "npipe:////./pipe/docker_engine")
            .env_remove("DOCKER_CONTEXT")
            .env_remove("DOCKER_TLS_VERIFY")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{command:?}: {stderr}");
        assert!(
            stderr.contains("node `local`: DOCKER_HOST: `npipe:////./pipe/docker_engine` is not an engine address"),
            "{command:?}: {stderr}"
        );
    }
}

/// Bytes that are not UTF-8 in any file hallmark parses are bad input (exit 2) at their line,
/// not an I/O error.
#[test]
fn a_file_that_is_not_utf8_names_its_line() {
    let good_spec = format!("{FROM}{}patches = [\"set\"]\n", source("a", "/a"));
    let good_pins = format!("{}{}", base_pin(), source_pin("a", "v1", COMMIT));
    let latin1 = |text: &str| {
        let mut bytes = text.as_bytes().to_vec();
        bytes.extend_from_slice(b"# caf\xe9\n");
        bytes
    };
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("images/bad/image.toml", latin1(&good_spec)),
        ("pins/bad.toml", latin1(&good_pins)),
        ("patches/set/series", latin1("0001-a.patch\n")),
        ("images/bad/Dockerfile.hbs", latin1("FROM x\n")),
    ];
    let mut runs = Vec::new();
    for (path, bytes) in cases {
        let project = TestProject::new();
        project
            .write("images/bad/image.toml", &good_spec)
            .write("pins/bad.toml", &good_pins)
            .write("patches/set/series", "0001-a.patch\n")
            .write("patches/set/0001-a.patch", &one_line_patch("x", "a", "b"));
        std::fs::write(project.root().join(path), bytes).unwrap();
        for command in [&["checksum", "bad"][..], &["render", "bad"]] {
            let run = project.run(command);
            let stderr = run.stderr();
            assert_eq!(run.code(), 2, "{path} {command:?}: {stderr}");
            runs.push((
                format!("{path}, {}", command.join(" ")),
                support::transcript(&project, &run),
            ));
        }
    }
    insta::assert_snapshot!("a_file_that_is_not_utf8", report(runs));
}

/// A spec or a series over 1 MiB is refused at once, exit 2, naming the file (a 42 MB spec
/// took 8 s and 1 GB to refuse; it could be a mistake or an attack).
#[test]
fn a_spec_or_series_over_a_mib_is_refused_naming_it() {
    let good_spec = format!("{FROM}{}patches = [\"set\"]\n", source("a", "/a"));
    let good_pins = format!("{}{}", base_pin(), source_pin("a", "v1", COMMIT));
    // Comments: valid text all the way, only its size is wrong.
    let padded = |text: &str| {
        format!(
            "{text}{}",
            "# padding padding padding padding\n".repeat(40_000)
        )
    };
    let mut runs = Vec::new();
    for path in ["images/bad/image.toml", "patches/set/series"] {
        let project = TestProject::new();
        project
            .write("images/bad/image.toml", &good_spec)
            .write("pins/bad.toml", &good_pins)
            .write("patches/set/series", "0001-a.patch\n")
            .write("patches/set/0001-a.patch", &one_line_patch("x", "a", "b"));
        let text = padded(&project.read(path));
        project.write(path, &text);
        let run = project.run(&["checksum", "bad"]);
        let stderr = run.stderr();
        assert_eq!(run.code(), 2, "{path}: {stderr}");
        runs.push((path.to_string(), support::transcript(&project, &run)));
    }
    insta::assert_snapshot!("a_spec_or_series_over_a_mib", report(runs));
}

/// A `[[file]]` src that is a symlink loop, leads through one, or dangles: exit 2 at its line.
#[test]
fn a_file_source_that_is_a_symlink_loop_names_its_line() {
    let mut runs = Vec::new();
    for src in ["loop", "loop/x", "gone", "dir/loop"] {
        let project = TestProject::new();
        project
            .write(
                "images/bad/image.toml",
                &format!("{FROM}[[file]]\nsrc = \"{src}\"\ndest = \"/opt/x\"\n"),
            )
            .write("pins/bad.toml", &base_pin())
            .write("images/bad/dir/ok", "ok");
        let dir = project.root().join("images/bad");
        std::os::unix::fs::symlink("loop", dir.join("loop")).unwrap();
        std::os::unix::fs::symlink("nowhere", dir.join("gone")).unwrap();
        std::os::unix::fs::symlink("loop", dir.join("dir/loop")).unwrap();
        for command in [
            &["checksum", "bad"][..],
            &["check", "bad"],
            &["render", "bad"],
        ] {
            let run = project.run(command);
            let stderr = run.stderr();
            assert_eq!(run.code(), 2, "{src} {command:?}: {stderr}");
            runs.push((
                format!("src = {src:?}, {}", command.join(" ")),
                support::transcript(&project, &run),
            ));
        }
    }
    insta::assert_snapshot!("a_file_source_that_is_a_symlink_loop", report(runs));
}

/// `check --all` reports an image's problem once even when it is also the cause another image
/// is not checked, met first: an outside test saw it panic there (exit 101) with two specs of
/// one image name, one of them the parent of a third.
#[test]
fn check_all_reports_a_cause_once_without_a_panic() {
    let project = TestProject::new();
    project
        .write("images/hello/image.toml", "[from]\nref = \"x:1\"\n")
        .write(
            "images/e4/image.toml",
            "[image]\nname = \"hello\"\n\n[from]\nimage = \"hello\"\n",
        )
        .write("images/e2/image.toml", "[from]\nimage = \"hello\"\n");
    let run = project.run(&["check", "--all"]);
    let stderr = run.stderr();
    assert_eq!(run.code(), 2, "{stderr}");
    insta::assert_snapshot!(
        "check_all_reports_a_cause_once",
        support::transcript(&project, &run)
    );
}

/// The builder under a node's name is one engine: under the name of a node with another
/// engine, the cluster file is refused (`nodes` showed two rows of one name, and `smoke
/// --node` took one of them; outside test). The same engine under both is fine.
#[test]
fn the_builder_under_a_node_name_with_another_engine_is_refused() {
    let project = TestProject::new();
    project.write("images/ok/image.toml", "[from]\nref = \"x:1\"\n");
    let cluster = |node_engine: &str| {
        format!(
            "[builder]\nname = \"node1\"\nengine = \"unix:///run/b.sock\"\n\n[[node]]\nname = \"node1\"\nengine = \"{node_engine}\"\n"
        )
    };
    project.write("hallmark.toml", &cluster("unix:///run/n.sock"));
    let run = project.run(&["nodes"]);
    assert_eq!(run.code(), 2, "{}", run.stderr());
    insta::assert_snapshot!(
        "the_builder_under_a_node_name_with_another_engine",
        support::transcript(&project, &run)
    );
    project.write("hallmark.toml", &cluster("unix:///run/b.sock"));
    // (Reached nowhere: down, exit 1, but the file is taken.)
    let run = project.run(&["nodes"]);
    assert_eq!(run.code(), 1, "{}", run.stderr());
}

/// Plain words for three errors an outside test found vague: a table written twice names the
/// table (the parser's "duplicate key" alone), a key twice names the key, an image that names
/// itself as parent points at the value (the caret was on `[from]`), and a name no image can
/// have is called invalid (not "no image").
#[test]
fn duplicate_keys_self_parents_and_invalid_names_are_said_plainly() {
    let project = TestProject::new();
    project
        .write(
            "images/tables/image.toml",
            "[from]\nref = \"x/y:1\"\n\n[env]\nA = \"1\"\n\n[env]\nB = \"2\"\n",
        )
        .write(
            "images/keys/image.toml",
            "[from]\nref = \"x/y:1\"\n\n[env]\nA = \"1\"\nA = \"2\"\n",
        )
        .write("images/selfish/image.toml", "[from]\nimage = \"selfish\"\n");
    let mut runs = Vec::new();
    for image in ["tables", "keys", "selfish", "with space"] {
        let run = project.run(&["check", image]);
        let stderr = run.stderr();
        assert_eq!(run.code(), 2, "{image}: {stderr}");
        runs.push((
            format!("check {image:?}"),
            support::transcript(&project, &run),
        ));
    }
    insta::assert_snapshot!(
        "duplicate_keys_self_parents_and_invalid_names",
        report(runs)
    );
}

/// A source whose `rev` is a full commit, pinned to another commit (a hand edit): refused,
/// naming both (`check` passed it, and the build would have used the pin's).
#[test]
fn a_commit_rev_pinned_to_another_commit_is_refused() {
    let project = TestProject::new();
    let other = "fedcba9876543210fedcba9876543210fedcba98";
    project
        .write(
            "images/app/image.toml",
            &format!(
                "{FROM}{}",
                source("a", "/a").replace("rev = \"v1\"", &format!("rev = \"{COMMIT}\""))
            ),
        )
        .write(
            "pins/app.toml",
            &format!("{}{}", base_pin(), source_pin("a", COMMIT, other)),
        );
    let run = project.run(&["checksum", "app"]);
    let stderr = run.stderr();
    assert_eq!(run.code(), 2, "{stderr}");
    insta::assert_snapshot!(
        "a_commit_rev_pinned_to_another_commit",
        support::transcript(&project, &run)
    );
}
