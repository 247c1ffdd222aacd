//! Hostile inputs, through the real binary and real git: patches and file sources that try
//! to reach outside their tree. Each gets a clear error (exit 2 for input, naming the file)
//! and writes nothing outside. Hostile archives are in src/store.rs's tests (the reader is
//! a library function), a node's forged image in tests/ship.rs
//! (`verify_fails_on_a_node_whose_content_differs_under_the_same_label`).

use crate::support;

use std::path::Path;
use support::{GitRepo, TestProject, one_line_patch};

const BASE_DIGEST: &str = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

/// A project whose image clones `upstream` at its head and applies the patch set `evil`.
fn patched(project: &TestProject, upstream: &GitRepo, commit: &str, patch: &str) {
    let url = upstream.url();
    project
        .write(
            "images/app/image.toml",
            &format!(
                "[image]\ntag = \"t\"\n\n[from]\nref = \"example/base:1\"\n\n\
                 [[source]]\nname = \"up\"\ngit = \"{url}\"\nrev = \"main\"\ndest = \"/src/up\"\n\
                 patches = [\"evil\"]\n"
            ),
        )
        .write(
            "pins/app.toml",
            &format!(
                "[base]\nref = \"example/base:1\"\ndigest = \"{BASE_DIGEST}\"\n\n\
                 [[source]]\nname = \"up\"\ngit = \"{url}\"\nrev = \"main\"\ncommit = \"{commit}\"\n"
            ),
        )
        .write("patches/evil/series", "0001-evil.patch\n")
        .write("patches/evil/0001-evil.patch", patch);
}

/// Every file below `dir`, as paths relative to it.
fn files_below(dir: &Path) -> Vec<String> {
    walkdir::WalkDir::new(dir)
        .into_iter()
        .flatten()
        .map(|e| e.path().strip_prefix(dir).unwrap().display().to_string())
        .collect()
}

#[test]
fn a_patch_through_a_symlink_in_the_source_is_refused_and_writes_nothing() {
    let project = TestProject::new();
    let outside = project.root().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let upstream = GitRepo::new(project.root(), "upstream");
    std::fs::write(upstream.path.join("a.txt"), "a\n").unwrap();
    std::os::unix::fs::symlink(&outside, upstream.path.join("link")).unwrap();
    let commit = upstream.commit(&[], "a symlink to a folder outside the tree");
    let patch = format!(
        "{}--- /dev/null\n+++ b/link/planted.txt\n@@ -0,0 +1 @@\n+planted\n",
        one_line_patch("a.txt", "a", "b")
    );
    patched(&project, &upstream, &commit, &patch);

    let run = project.run(&["check", "app"]);
    assert_ne!(run.code(), 0, "{}", run.stdout());
    let stderr = run.stderr();
    assert!(
        stderr.contains("evil") && stderr.contains("0001-evil.patch"),
        "names the set and the patch: {stderr}"
    );
    assert!(stderr.contains("symbolic link"), "says why: {stderr}");
    assert!(
        files_below(&outside).iter().all(|f| f.is_empty()),
        "nothing planted"
    );
    // Neither the render's context.
    let out = project.root().join("ctx");
    let run = project.run(&["render", "app", "--out", out.to_str().unwrap()]);
    assert_ne!(run.code(), 0);
    assert!(files_below(&outside).iter().all(|f| f.is_empty()));
}

#[test]
fn a_patch_creating_a_file_outside_by_its_git_header_is_refused_before_git_runs() {
    let project = TestProject::new();
    let upstream = GitRepo::new(project.root(), "upstream");
    let commit = upstream.commit(&[("a.txt", "a\n")], "first");
    let patch = format!(
        "{}diff --git a/../../escaped b/../../escaped\nnew file mode 100644\n",
        one_line_patch("a.txt", "a", "b")
    );
    patched(&project, &upstream, &commit, &patch);
    let run = project.run(&["check", "app"]);
    assert_eq!(run.code(), 2, "{}", run.stderr());
    let stderr = run.stderr();
    assert!(
        stderr.contains("patches/evil/0001-evil.patch")
            && stderr.contains("outside the source tree"),
        "{stderr}"
    );
    assert!(!project.root().join("escaped").exists());
}

#[test]
fn a_file_source_reaching_out_through_a_symlink_is_refused() {
    let project = TestProject::new();
    project.write("secret/key", "not for the image\n");
    let spec = |src: &str| {
        format!(
            "[image]\ntag = \"t\"\n\n[from]\nref = \"example/base:1\"\n\n\
             [[file]]\nsrc = \"{src}\"\ndest = \"/etc/x\"\n"
        )
    };
    let pins = format!("[base]\nref = \"example/base:1\"\ndigest = \"{BASE_DIGEST}\"\n");
    let dir = project.root().join("images/app");
    std::fs::create_dir_all(&dir).unwrap();
    // The file itself is a link; and a folder on the way is one.
    std::os::unix::fs::symlink(project.root().join("secret/key"), dir.join("key")).unwrap();
    std::os::unix::fs::symlink(project.root().join("secret"), dir.join("sub")).unwrap();
    for src in ["key", "sub/key", "sub"] {
        project
            .write("images/app/image.toml", &spec(src))
            .write("pins/app.toml", &pins);
        let out = project
            .root()
            .join(format!("ctx-{}", src.replace('/', "-")));
        let run = project.run(&["render", "app", "--out", out.to_str().unwrap()]);
        assert_eq!(run.code(), 2, "{src}: {}", run.stdout());
        let stderr = run.stderr();
        assert!(
            stderr.contains("images/app/image.toml") && stderr.contains("through a symlink"),
            "{src}: {stderr}"
        );
        assert!(!out.exists() || files_below(&out).iter().all(|f| !f.contains("key")));
        let run = project.run(&["checksum", "app"]);
        assert_eq!(run.code(), 2, "{src}: checksum too");
    }
}

/// A spec folder, a patch set or a patch file that is a symlink to outside the project is
/// refused, exit 2, naming the link and where it leads: an outside test saw a spec folder
/// linked from elsewhere copy files from there into the image, and patch files linked from
/// outside accepted.
#[test]
fn spec_folders_patch_sets_and_patches_linked_from_outside_the_project_are_refused() {
    let elsewhere = tempfile::tempdir().unwrap();
    let outside = elsewhere.path();
    let link = |target: &Path, at: &Path| {
        std::fs::create_dir_all(at.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(target, at).unwrap();
    };
    let refused = |project: &TestProject, image: &str, link: &str| {
        let run = project.run(&["check", image]);
        let stderr = run.stderr();
        assert_eq!(run.code(), 2, "{stderr}");
        assert!(stderr.contains(link), "names the link {link}: {stderr}");
        assert!(stderr.contains("outside the project"), "{stderr}");
    };

    // A spec folder.
    let project = TestProject::new();
    std::fs::create_dir_all(outside.join("spec")).unwrap();
    std::fs::write(
        outside.join("spec/image.toml"),
        "[from]\nref = \"example/base:1\"\n",
    )
    .unwrap();
    std::fs::write(outside.join("spec/secret.txt"), "from outside\n").unwrap();
    link(&outside.join("spec"), &project.root().join("images/linked"));
    refused(&project, "linked", "images/linked");

    // A spec file, and a pin file (an outside test found both accepted).
    let project = TestProject::new();
    std::fs::create_dir_all(project.root().join("images/file")).unwrap();
    link(
        &outside.join("spec/image.toml"),
        &project.root().join("images/file/image.toml"),
    );
    refused(&project, "file", "images/file/image.toml");
    let project = TestProject::new();
    project.write(
        "images/pinned/image.toml",
        "[from]\nref = \"example/base:1\"\n",
    );
    std::fs::write(outside.join("pin.toml"), "").unwrap();
    link(
        &outside.join("pin.toml"),
        &project.root().join("pins/pinned.toml"),
    );
    refused(&project, "pinned", "pins/pinned.toml");

    // A patch set, and a patch file.
    let patch = one_line_patch("a.txt", "a", "b");
    for linked in ["patches/evil", "patches/evil/0001-evil.patch"] {
        let project = TestProject::new();
        let upstream = GitRepo::new(project.root(), "upstream");
        std::fs::write(upstream.path.join("a.txt"), "a\n").unwrap();
        let commit = upstream.commit(&[], "a");
        patched(&project, &upstream, &commit, &patch);
        let target = outside.join(format!("set-{}", linked.len()));
        std::fs::create_dir_all(&target).unwrap();
        let inside = project.root().join(linked);
        if linked.ends_with(".patch") {
            std::fs::rename(&inside, target.join("p.patch")).unwrap();
            link(&target.join("p.patch"), &inside);
        } else {
            for file in ["series", "0001-evil.patch"] {
                std::fs::rename(inside.join(file), target.join(file)).unwrap();
            }
            std::fs::remove_dir(&inside).unwrap();
            link(&target, &inside);
        }
        refused(&project, "app", linked);
    }
}
