//! Test fixtures: a project in a temp folder, real git repositories, and the real binary.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub struct TestProject {
    pub dir: tempfile::TempDir,
}

impl TestProject {
    pub fn new() -> TestProject {
        let dir = tempfile::Builder::new()
            .prefix("hallmark-test")
            .tempdir()
            .unwrap();
        std::fs::create_dir_all(dir.path().join("images")).unwrap();
        TestProject { dir }
    }

    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    pub fn write(&self, relative: &str, text: &str) -> &Self {
        let path = self.root().join(relative);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
        self
    }

    pub fn read(&self, relative: &str) -> String {
        std::fs::read_to_string(self.root().join(relative)).unwrap()
    }

    /// Runs hallmark in the project root with a private cache.
    pub fn run(&self, args: &[&str]) -> Run {
        run_in(self.root(), args)
    }
}

pub fn hallmark() -> Command {
    Command::new(env!("CARGO_BIN_EXE_hallmark"))
}

pub fn run_in(dir: &Path, args: &[&str]) -> Run {
    let output = hallmark()
        .args(args)
        .current_dir(dir)
        .env("HALLMARK_CACHE", dir.join(".test-cache"))
        .env_remove("DOCKER_HOST")
        .output()
        .unwrap();
    Run(output)
}

pub struct Run(pub Output);

impl Run {
    pub fn code(&self) -> i32 {
        self.0
            .status
            .code()
            .expect("exited, not killed by a signal")
    }
    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.0.stdout).into_owned()
    }
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.0.stderr).into_owned()
    }
    #[track_caller]
    pub fn success(&self) -> &Self {
        assert_eq!(
            self.code(),
            0,
            "stdout:\n{}\nstderr:\n{}",
            self.stdout(),
            self.stderr()
        );
        self
    }
}

/// A real git repository with one file per commit; returns its path.
pub struct GitRepo {
    pub path: PathBuf,
}

impl GitRepo {
    pub fn new(parent: &Path, name: &str) -> GitRepo {
        let path = parent.join(name);
        std::fs::create_dir_all(&path).unwrap();
        let repo = GitRepo { path };
        repo.git(&["init", "--quiet", "--initial-branch=main"]);
        repo
    }

    pub fn git(&self, args: &[&str]) -> String {
        let output = Command::new("git")
            .args([
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@example.org",
                "-c",
                "commit.gpgsign=false",
                "-c",
                "tag.gpgsign=false",
            ])
            .args(args)
            .current_dir(&self.path)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).trim().to_string()
    }

    /// Writes files and commits them; returns the commit id.
    pub fn commit(&self, files: &[(&str, &str)], message: &str) -> String {
        for (name, text) in files {
            let path = self.path.join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        self.git(&["add", "-A"]);
        self.git(&["commit", "--quiet", "-m", message]);
        self.git(&["rev-parse", "HEAD"])
    }

    pub fn url(&self) -> String {
        self.path.display().to_string()
    }
}

/// A unified diff changing `old` to `new` in `file` (a one-line file).
pub fn one_line_patch(file: &str, old: &str, new: &str) -> String {
    format!("--- a/{file}\n+++ b/{file}\n@@ -1 +1 @@\n-{old}\n+{new}\n")
}
