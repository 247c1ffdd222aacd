//! Signed provenance (issue 34): signed at the build with the operator's OpenSSH ed25519
//! key, checked by an independent DSSE implementation (securesystemslib), and by `verify
//! --provenance` on every node of the testbed (Docker 20.10 classic, local and over ssh;
//! Docker 26 and 28 on the containerd store) after distribute; a node where another image
//! was tagged in place, and an envelope signed by a key hallmark.toml does not trust, fail.

use crate::support::{self, TestProject, Testbed, hallmark_json, unique};
use std::path::Path;
use std::process::Command;

/// Checks `envelope` with securesystemslib's DSSE and the public key at `public`; returns
/// the Statement it carries.
fn checked_elsewhere(envelope: &Path, public: &Path) -> Result<serde_json::Value, String> {
    let script = r#"
import json, sys
from cryptography.hazmat.primitives.serialization import load_ssh_public_key, Encoding, PublicFormat
from securesystemslib.dsse import Envelope
from securesystemslib.signer import SSlibKey
envelope = Envelope.from_dict(json.load(open(sys.argv[1])))
raw = load_ssh_public_key(open(sys.argv[2], 'rb').read()).public_bytes(Encoding.Raw, PublicFormat.Raw)
keyid = list(envelope.signatures)[0]
key = SSlibKey(keyid, 'ed25519', 'ed25519', {'public': raw.hex()})
envelope.verify([key], 1)
print(envelope.payload.decode())
"#;
    let out = Command::new(support::python_tools().join("bin/python"))
        .args(["-c", script])
        .arg(envelope)
        .arg(public)
        .output()
        .unwrap();
    match out.status.success() {
        true => Ok(serde_json::from_slice(&out.stdout).unwrap()),
        false => Err(String::from_utf8_lossy(&out.stderr).into_owned()),
    }
}

#[test]
fn provenance_is_signed_checked_elsewhere_and_verified_on_every_node() {
    let testbed = Testbed::get();
    let project = TestProject::new();
    let run = unique();
    project
        .write(
            "images/signed/image.toml",
            &format!(
                "[image]\nname = \"hm-signed-{run}\"\n\n[from]\nref = \"hallmark-testbed/busybox:latest\"\n\n[[file]]\nsrc = \"note\"\ndest = \"/etc/note\"\n"
            ),
        )
        .write("images/signed/note", &format!("{run}\n"));
    support::ed25519_key(&project.root().join("keys/hallmark"));
    support::ed25519_key(&project.root().join("keys/stranger"));
    let cluster = std::fs::read_to_string(testbed.config()).unwrap();
    let config = project.root().join("cluster.toml");
    let with = |trusted: &str| {
        format!("{cluster}\n[provenance]\nkey = \"keys/hallmark\"\ntrusted = [\"{trusted}\"]\n")
    };
    std::fs::write(&config, with("keys/hallmark.pub")).unwrap();
    let tag = format!("hm-signed-{run}:latest");
    let signed = project.with_config(&config);

    // Before a build: nothing to print, and it says why.
    signed.run(&["lock", "signed"]).success();
    let none = signed.run(&["provenance", "signed"]);
    assert_eq!(none.code(), 2, "{}", none.stderr());
    assert!(
        none.stderr().contains("does not exist"),
        "{}",
        none.stderr()
    );

    let built = signed.run(&["build", "signed"]).success().stderr();
    assert!(built.contains("provenance signed by SHA256:"), "{built}");
    let envelope = signed.run(&["provenance", "signed"]).success().stdout();
    let kept = project.root().join("envelope.json");
    std::fs::write(&kept, &envelope).unwrap();
    let statement = checked_elsewhere(&kept, &project.root().join("keys/hallmark.pub"))
        .unwrap_or_else(|e| panic!("securesystemslib: {e}\n{envelope}"));
    assert_eq!(statement["_type"], "https://in-toto.io/Statement/v1");
    assert_eq!(statement["predicateType"], "https://slsa.dev/provenance/v1");
    // The builder is a classic store: its image id is the config digest, the subject.
    let id = testbed.image_id("builder", &tag);
    assert_eq!(
        format!(
            "sha256:{}",
            statement["subject"][0]["digest"]["sha256"]
                .as_str()
                .unwrap()
        ),
        id
    );
    assert!(
        checked_elsewhere(&kept, &project.root().join("keys/stranger.pub")).is_err(),
        "another key verified the envelope"
    );

    // Distributed: every node holds the signed subject.
    signed.run(&["distribute", "signed"]).success();
    let (code, rows) = hallmark_json(&project, &config, &["verify", "--provenance", "signed"]);
    assert_eq!(code, 0, "{rows}");
    let nodes = testbed.nodes();
    for node in &nodes {
        let row = support::row(&rows, node);
        assert_eq!(row["state"], "current", "{row}");
        assert!(
            row["detail"]
                .as_str()
                .unwrap()
                .contains("provenance signed by"),
            "{row}"
        );
    }

    // Signed by a key hallmark.toml does not trust: every node's row says so.
    std::fs::write(&config, with("keys/stranger.pub")).unwrap();
    let (code, rows) = hallmark_json(&project, &config, &["verify", "--provenance", "signed"]);
    assert_eq!(code, 1, "{rows}");
    for node in &nodes {
        let row = support::row(&rows, node);
        assert_eq!(row["state"], "unsigned", "{row}");
        assert!(
            row["detail"]
                .as_str()
                .unwrap()
                .contains("no signature verifies"),
            "{row}"
        );
    }
    // A trusted file of several keys, as authorized_keys: any of them may have signed.
    let both = [
        std::fs::read_to_string(project.root().join("keys/stranger.pub")).unwrap(),
        std::fs::read_to_string(project.root().join("keys/hallmark.pub")).unwrap(),
    ]
    .concat();
    std::fs::write(project.root().join("keys/both.pub"), both).unwrap();
    std::fs::write(&config, with("keys/both.pub")).unwrap();
    let (code, rows) = hallmark_json(&project, &config, &["verify", "--provenance", "signed"]);
    assert_eq!(code, 0, "{rows}");
    std::fs::write(&config, with("keys/hallmark.pub")).unwrap();

    // Another image tagged in place on one node: that node fails, the others pass.
    let victim = &nodes[0];
    testbed.docker_ok(victim, &["tag", "hallmark-testbed/busybox:latest", &tag]);
    let (code, rows) = hallmark_json(&project, &config, &["verify", "--provenance", "signed"]);
    assert_eq!(code, 1, "{rows}");
    let row = support::row(&rows, victim);
    assert_ne!(row["state"], "current", "{row}");
    assert!(
        row["detail"]
            .as_str()
            .unwrap()
            .contains("does not hold the signed subject"),
        "{row}"
    );
    for node in nodes.iter().skip(1) {
        assert_eq!(support::row(&rows, node)["state"], "current");
    }

    // A new signing key: the next build signs again (the kept envelope is the old key's).
    testbed.docker_ok(victim, &["rmi", &tag]);
    support::ed25519_key(&project.root().join("keys/second"));
    let second = format!(
        "{cluster}\n[provenance]\nkey = \"keys/second\"\ntrusted = [\"keys/second.pub\"]\n"
    );
    std::fs::write(&config, second).unwrap();
    let resigned = signed.run(&["build", "signed"]).success().stderr();
    assert!(resigned.contains("provenance signed by"), "{resigned}");
    signed.run(&["distribute", "signed"]).success();
    let (code, rows) = hallmark_json(&project, &config, &["verify", "--provenance", "signed"]);
    assert_eq!(code, 0, "{rows}");

    // Without trusted keys, verify --provenance says nothing can be checked.
    std::fs::write(&config, &cluster).unwrap();
    let bare = signed.run(&["verify", "--provenance", "signed"]);
    assert_eq!(bare.code(), 2, "{}", bare.stderr());
    assert!(bare.stderr().contains("trusts no key"), "{}", bare.stderr());

    for node in std::iter::once("builder").chain(nodes.iter().map(String::as_str)) {
        let _ = testbed.docker(node, &["rmi", &tag]);
    }
}

/// Issue 42: a `[provenance] key` that cannot sign (missing, with a passphrase, an RSA key)
/// is refused before anything is built, naming the key: the builder is not even asked (here
/// it is unreachable; the old build connected, built, and failed at the signature).
#[test]
fn an_unusable_provenance_key_is_refused_before_the_build_starts() {
    let project = support::ship_project(1, "key");
    let keys = project.root().join("keys");
    std::fs::create_dir_all(&keys).unwrap();
    for (name, args) in [
        ("locked", &["-t", "ed25519", "-N", "a passphrase"][..]),
        ("rsa", &["-t", "rsa", "-b", "2048", "-N", ""][..]),
    ] {
        let made = Command::new("ssh-keygen")
            .arg("-q")
            .args(args)
            .arg("-f")
            .arg(keys.join(name))
            .status()
            .unwrap();
        assert!(made.success(), "ssh-keygen {name}");
    }
    for (key, why) in [
        ("keys/missing", "No such file"),
        ("keys/locked", "passphrase"),
        ("keys/rsa", "ed25519"),
    ] {
        project.write(
            "hallmark.toml",
            &format!(
                "[builder]\nname = \"builder\"\nengine = \"unix:///nonexistent/hm-key.sock\"\n\n[provenance]\nkey = \"{key}\"\n"
            ),
        );
        let run = project.run(&["build", "wrap"]);
        let stderr = run.stderr();
        assert_eq!(run.code(), 2, "{key}: {stderr}");
        assert!(stderr.contains("`[provenance] key`"), "{key}: {stderr}");
        assert!(stderr.contains(key), "{key}: {stderr}");
        assert!(stderr.contains(why), "{key}: {stderr}");
        assert!(!stderr.contains("hm-key.sock"), "{key}: {stderr}");
    }
}
