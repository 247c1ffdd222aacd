//! SBOMs (issue 34): `hallmark sbom` from the plan and pins, offline, checked by the SPDX
//! project's own validator (`pyspdxtools`, PyPI `spdx-tools`) and CycloneDX's
//! (`cyclonedx-python-lib`'s strict JSON schema validator), and the same bytes from two
//! copies of a project. The validators are installed from PyPI once (`support::python_tools`).

use crate::support::{self, GitRepo, TestProject, one_line_patch, run_in};
use std::path::Path;
use std::process::Command;

fn valid_spdx(path: &Path) -> Result<(), String> {
    let out = Command::new(support::python_tools().join("bin/pyspdxtools"))
        .arg("-i")
        .arg(path)
        .output()
        .unwrap();
    match out.status.success() {
        true => Ok(()),
        false => Err(String::from_utf8_lossy(&out.stderr).into_owned()),
    }
}

fn valid_cyclonedx(path: &Path) -> Result<(), String> {
    let script = "import sys\nfrom cyclonedx.validation.json import JsonStrictValidator\nfrom cyclonedx.schema import SchemaVersion\ne = JsonStrictValidator(SchemaVersion.V1_6).validate_str(open(sys.argv[1]).read())\nprint(e or '')\nsys.exit(1 if e else 0)\n";
    let out = Command::new(support::python_tools().join("bin/python"))
        .args(["-c", script])
        .arg(path)
        .output()
        .unwrap();
    match out.status.success() {
        true => Ok(()),
        false => Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )),
    }
}

/// An image with every kind of input: a base by digest, a patched source, a file, a wheel
/// pin and apt pins (written by hand: offline), and a child image on it.
fn project() -> TestProject {
    let project = TestProject::new();
    let upstream = GitRepo::new(project.root(), "upstream");
    let commit = upstream.commit(&[("greeting.txt", "hello\n")], "first");
    let url = upstream.url();
    let sha = |c: char| c.to_string().repeat(64);
    project
        .write(
            "images/app/image.toml",
            &format!(
                "[from]\nref = \"example/base:1\"\n\n[[source]]\nname = \"upstream\"\ngit = \"{url}\"\nrev = \"{commit}\"\ndest = \"/src/upstream\"\npatches = [\"fix\"]\n\n[[file]]\nsrc = \"run.sh\"\ndest = \"/usr/local/bin/run.sh\"\n\n[build]\napt = [\"jq\"]\n"
            ),
        )
        .write("images/app/run.sh", "#!/bin/sh\necho run\n")
        .write("patches/fix/series", "0001-world.patch\n")
        .write(
            "patches/fix/0001-world.patch",
            &one_line_patch("greeting.txt", "hello", "hello world"),
        )
        .write(
            "pins/app.toml",
            &format!(
                r#"[base]
ref = "example/base:1"
digest = "sha256:{}"

[[source]]
name = "upstream"
git = "{url}"
rev = "{commit}"
commit = "{commit}"

[apt-against]
build = "base example/base:1 sha256:{}"

[[apt]]
name = "jq"
version = "1.6-2.1+deb12u2"
architecture = "amd64"
wanted = true
archive = "http://deb.debian.org/debian"
path = "pool/main/j/jq/jq_1.6-2.1+deb12u2_amd64.deb"
size = 63984
sha256 = "{}"

[[apt]]
name = "libstdc++6"
version = "1:12.2.0-14"
architecture = "amd64"
archive = "http://deb.debian.org/debian"
path = "pool/main/g/gcc-12/libstdc++6_12.2.0-14_amd64.deb"
size = 10
sha256 = "{}"
"#,
                sha('a'),
                sha('a'),
                sha('b'),
                sha('c')
            ),
        )
        .write(
            "images/addon/image.toml",
            "[from]\nimage = \"app\"\n\n[[wheel]]\nname = \"b12x\"\nversion = \"1.3.0\"\n",
        )
        .write(
            "pins/addon.toml",
            &format!(
                "[[wheel]]\nname = \"b12x\"\nversion = \"1.3.0\"\nfile = \"b12x-1.3.0-py3-none-any.whl\"\nsha256 = \"{}\"\n",
                sha('d')
            ),
        );
    project
}

#[test]
fn sboms_validate_name_every_input_and_are_the_same_bytes_from_another_copy() {
    let project = project();
    let spdx = project.run(&["sbom", "addon"]).success().stdout();
    let cyclonedx = project
        .run(&["sbom", "addon", "--format", "cyclonedx"])
        .success()
        .stdout();
    let dir = tempfile::tempdir().unwrap();
    let (spdx_path, cdx_path) = (
        dir.path().join("a.spdx.json"),
        dir.path().join("a.cdx.json"),
    );
    std::fs::write(&spdx_path, &spdx).unwrap();
    std::fs::write(&cdx_path, &cyclonedx).unwrap();
    valid_spdx(&spdx_path).unwrap_or_else(|e| panic!("SPDX: {e}\n{spdx}"));
    valid_cyclonedx(&cdx_path).unwrap_or_else(|e| panic!("CycloneDX: {e}\n{cyclonedx}"));

    // Every input is named, with its hash and purl where it has them.
    let document: serde_json::Value = serde_json::from_str(&spdx).unwrap();
    let packages = document["packages"].as_array().unwrap();
    let named = |name: &str| {
        packages
            .iter()
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("no package {name}: {spdx}"))
    };
    assert_eq!(named("upstream")["primaryPackagePurpose"], "SOURCE");
    assert_eq!(
        named("patches/fix/0001-world.patch")["checksums"][0]["algorithm"],
        "SHA256"
    );
    assert_eq!(
        named("/usr/local/bin/run.sh")["primaryPackagePurpose"],
        "FILE"
    );
    assert_eq!(
        named("b12x")["externalRefs"][0]["referenceLocator"],
        "pkg:pypi/b12x@1.3.0"
    );
    assert_eq!(
        named("libstdc++6")["externalRefs"][0]["referenceLocator"],
        "pkg:deb/debian/libstdc%2B%2B6@1%3A12.2.0-14?arch=amd64"
    );
    assert_eq!(
        named("example/base:1")["versionInfo"],
        format!("sha256:{}", "a".repeat(64))
    );
    let relations: Vec<&str> = document["relationships"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["relationshipType"].as_str().unwrap())
        .collect();
    for wanted in ["DESCRIBES", "CONTAINS", "DESCENDANT_OF", "PATCH_APPLIED"] {
        assert!(relations.contains(&wanted), "{wanted}: {relations:?}");
    }

    // Another copy of the project (another folder, another cache): the same bytes.
    let copy = tempfile::tempdir().unwrap();
    let copied = Command::new("cp")
        .arg("-a")
        .arg(format!("{}/.", project.root().display()))
        .arg(copy.path())
        .status()
        .unwrap();
    assert!(copied.success());
    let _ = std::fs::remove_dir_all(copy.path().join(".test-cache"));
    let _ = std::fs::remove_dir_all(copy.path().join(".hallmark"));
    assert_eq!(
        run_in(copy.path(), &["sbom", "addon"]).success().stdout(),
        spdx
    );
    assert_eq!(
        run_in(copy.path(), &["sbom", "addon", "--format", "cyclonedx"])
            .success()
            .stdout(),
        cyclonedx
    );

    // A changed input is another document.
    project.write(
        "patches/fix/0001-world.patch",
        &one_line_patch("greeting.txt", "hello", "hello there"),
    );
    assert_ne!(project.run(&["sbom", "addon"]).success().stdout(), spdx);
}

#[test]
fn the_repositorys_own_images_give_valid_sboms_with_their_compile_stage() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    for image in ["dsv41-flash", "dsv41-flash-b12x", "hello"] {
        for format in ["spdx", "cyclonedx"] {
            let path = dir.path().join(format!("{image}.{format}.json"));
            run_in(
                root,
                &[
                    "sbom",
                    image,
                    "--format",
                    format,
                    "--out",
                    path.to_str().unwrap(),
                ],
            )
            .success();
            let checked = match format {
                "spdx" => valid_spdx(&path),
                _ => valid_cyclonedx(&path),
            };
            checked.unwrap_or_else(|e| panic!("{image} {format}: {e}"));
        }
    }
    let text = std::fs::read_to_string(dir.path().join("dsv41-flash.spdx.json")).unwrap();
    assert!(text.contains("\"GENERATES\""), "{text}");
    assert!(text.contains("\"GENERATED_FROM\""), "{text}");
    assert!(
        text.contains(
            "git+https://github.com/vllm-project/vllm.git@b8b302cde434df8c9289a2b465406b47ebab1c2d"
        ),
        "{text}"
    );
}

#[test]
fn a_bad_image_or_output_path_is_named() {
    let project = project();
    let run = project.run(&["sbom", "nope"]);
    assert_eq!(run.code(), 2, "{}", run.stderr());
    assert!(run.stderr().contains("no image `nope`"), "{}", run.stderr());
    let run = project.run(&["sbom", "addon", "--out", "/nonexistent-dir/x.json"]);
    assert_ne!(run.code(), 0);
    assert!(
        run.stderr().contains("/nonexistent-dir"),
        "{}",
        run.stderr()
    );
}

/// Outside test: a token in a git URL reached the SBOM (labels never carried it).
#[test]
fn credentials_in_a_git_url_never_reach_the_sbom() {
    let project = TestProject::new();
    let url = "https://oauth2:S3CRETTOKEN@example.com/org/priv.git";
    let commit = "c".repeat(40);
    project
        .write(
            "images/priv/image.toml",
            &format!("[from]\nref = \"example/base:1\"\n\n[[source]]\nname = \"priv\"\ngit = \"{url}\"\nrev = \"{commit}\"\ndest = \"/src/priv\"\n"),
        )
        .write(
            "pins/priv.toml",
            &format!("[base]\nref = \"example/base:1\"\ndigest = \"sha256:{}\"\n\n[[source]]\nname = \"priv\"\ngit = \"{url}\"\nrev = \"{commit}\"\ncommit = \"{commit}\"\n", "a".repeat(64)),
        );
    for format in ["spdx", "cyclonedx"] {
        let text = project
            .run(&["sbom", "priv", "--format", format])
            .success()
            .stdout();
        assert!(!text.contains("S3CRETTOKEN"), "{format}: {text}");
        assert!(
            text.contains("example.com/org/priv.git"),
            "{format}: {text}"
        );
    }
}
