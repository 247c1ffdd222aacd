//! Every verb takes Ctrl-C (SIGINT) and SIGTERM alike: it says what it has (the table, rows
//! `interrupted`), leaves no file half written and no program it started running, and
//! exits 130. One harness: each verb is stopped at a real sign that its work is under way
//! (an engine that froze on its request, a git remote that does not answer, a stdout
//! nobody reads), by each signal, and must end within a deadline.

use crate::faults::freezing_proxy_either_way;
use crate::support::{self, GitRepo, TestProject, Testbed, wait_for};
use std::io::{BufRead as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

const SIGNALS: [&str; 2] = ["INT", "TERM"];

/// A verb stopped by a signal: its exit code, stdout and stderr.
struct Stopped {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Starts `command`, waits until hallmark watches for signals (its debug line) and `under_way`
/// holds, sends SIG`signal` to hallmark alone (not its children: a CI cancel or `kill`), and
/// gives what it said; it must end within two minutes.
fn stop(mut command: Command, signal: &str, under_way: impl Fn() -> bool) -> Stopped {
    let mut child: Child = command
        .env("RUST_LOG", "hallmark=debug")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = Arc::new(Mutex::new(String::new()));
    let reader = {
        let (stderr, pipe) = (Arc::clone(&stderr), child.stderr.take().unwrap());
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(pipe).lines() {
                let line = line.unwrap_or_default();
                stderr.lock().unwrap().push_str(&(line + "\n"));
            }
        })
    };
    // A build run in its place (HALLMARK_TEST_BIN, an older one) may not say it watches.
    let other_build = std::env::var_os("HALLMARK_TEST_BIN").is_some();
    wait_for("hallmark watching signals, its work under way", || {
        let said = other_build
            || stderr
                .lock()
                .unwrap()
                .contains("watching SIGINT and SIGTERM");
        (said && under_way()) || child.try_wait().unwrap().is_some()
    });
    Command::new("kill")
        .args([&format!("-{signal}"), &child.id().to_string()])
        .status()
        .unwrap();
    // Two minutes at most; past that the verb is killed and the test fails on `None`.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    reader.join().unwrap();
    let mut stdout = String::new();
    if let Some(mut pipe) = child.stdout.take() {
        use std::io::Read as _;
        let _ = pipe.read_to_string(&mut stdout);
    }
    let stderr = stderr.lock().unwrap().clone();
    Stopped {
        code,
        stdout,
        stderr,
    }
}

/// hallmark in `project` with its own cache, stdout piped.
fn hallmark(project: &TestProject, config: Option<&Path>, args: &[&str]) -> Command {
    let mut command = match config {
        Some(config) => support::hallmark_at(config),
        None => support::hallmark(),
    };
    command
        .args(args)
        .current_dir(project.root())
        .env("HALLMARK_CACHE", project.root().join(".test-cache"))
        .env_remove("DOCKER_HOST")
        .stdout(Stdio::piped());
    command
}

/// A `git` first on PATH that, asked to reach a remote (`fetch`, `ls-remote`), writes its pid
/// to `marker` and never answers, as a remote behind a dead link; the real git otherwise.
fn git_whose_remote_hangs(dir: &Path) -> (String, PathBuf) {
    let bin = dir.join("hanging-git");
    std::fs::create_dir_all(&bin).unwrap();
    let marker = dir.join("git-hangs.pid");
    let real = String::from_utf8(
        Command::new("sh")
            .args(["-c", "command -v git"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let script = format!(
        "#!/bin/sh\ncase \" $* \" in *\" fetch \"*|*\" ls-remote \"*) echo $$ > {marker}.tmp; mv {marker}.tmp {marker}; exec sleep 600;; esac\nexec {real} \"$@\"\n",
        marker = marker.display(),
        real = real.trim()
    );
    support::write_executable(&bin.join("git"), &script);
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    (path, marker)
}

/// Whether the process `pid` has ended (gone, or a zombie no one reaped yet).
fn ended(pid: &str) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

/// An image `app` on `upstream`'s `main`, its base pinned by hand, with one patch set; with
/// `commit`, its source pinned too.
fn project_on(upstream: &GitRepo, commit: Option<&str>) -> TestProject {
    let project = TestProject::new();
    let url = upstream.url();
    let digest = format!("sha256:{}", "a".repeat(64));
    project
        .write(
            "images/app/image.toml",
            &format!(
                "[from]\nref = \"example/base:1\"\n\n[[source]]\nname = \"up\"\ngit = \"{url}\"\nrev = \"main\"\ndest = \"/src/up\"\npatches = [\"fix\"]\n"
            ),
        )
        .write(
            "patches/fix/0001-fix.patch",
            &support::one_line_patch("a.txt", "line 2", "line 2 fixed"),
        )
        .write("patches/fix/series", "0001-fix.patch\n");
    let source = match commit {
        Some(commit) => format!(
            "\n[[source]]\nname = \"up\"\ngit = \"{url}\"\nrev = \"main\"\ncommit = \"{commit}\"\n"
        ),
        None => String::new(),
    };
    project.write(
        "pins/app.toml",
        &format!("[base]\nref = \"example/base:1\"\ndigest = \"{digest}\"\n{source}"),
    );
    project
}

/// A verb that reaches a git remote (`lock`, `patches report`, `bump`): stopped while the
/// remote does not answer, it ends 130 saying interrupted, the git it started has ended,
/// and the pins and patches are as they were.
#[test]
fn verbs_on_a_git_remote_that_hangs_end_on_either_signal_with_130() {
    let scratch = tempfile::tempdir().unwrap();
    let upstream = GitRepo::new(scratch.path(), "upstream");
    let v1 = upstream.commit(&[("a.txt", "line 1\nline 2\nline 3\n")], "v1");
    upstream.commit(&[("a.txt", "line 0\nline 1\nline 2\nline 3\n")], "v2");
    let cases: [(&str, Option<&str>, &[&str]); 3] = [
        ("lock", None, &["lock", "app"]),
        ("patches", Some(&v1), &["patches", "report", "app"]),
        ("bump", Some(&v1), &["bump", "app"]),
    ];
    for (verb, pinned, args) in cases {
        for signal in SIGNALS {
            let project = project_on(&upstream, pinned);
            let (path, marker) = git_whose_remote_hangs(project.root());
            let (pins, series) = (
                project.read("pins/app.toml"),
                project.read("patches/fix/series"),
            );
            let mut command = hallmark(&project, None, args);
            command.env("PATH", &path);
            let stopped = stop(command, signal, || marker.exists());
            let said = format!("{verb} SIG{signal}: {}{}", stopped.stdout, stopped.stderr);
            assert_eq!(stopped.code, Some(130), "{said}");
            assert!(stopped.stderr.contains("interrupted"), "{said}");
            let git = std::fs::read_to_string(&marker).unwrap();
            let what = format!("the git {verb} started ended on SIG{signal} (pid {git})");
            wait_for(&what, || ended(git.trim()));
            assert_eq!(project.read("pins/app.toml"), pins, "{said}");
            assert_eq!(project.read("patches/fix/series"), series, "{said}");
        }
    }
}

/// `sbom` (offline) stopped while its stdout is full (a reader that stopped reading): 130.
#[test]
fn sbom_stopped_while_writing_ends_with_130() {
    let scratch = tempfile::tempdir().unwrap();
    let upstream = GitRepo::new(scratch.path(), "upstream");
    let v1 = upstream.commit(&[("a.txt", "line 1\nline 2\nline 3\n")], "v1");
    for signal in SIGNALS {
        let project = project_on(&upstream, Some(&v1));
        // A pipe filled before hallmark writes: its first write waits for good.
        let (reader, mut writer) = std::io::pipe().unwrap();
        let filled = fill(&mut writer);
        let mut command = hallmark(&project, None, &["sbom", "app"]);
        command.stdout(writer);
        let stopped = stop(command, signal, || filled);
        drop(reader);
        assert_eq!(stopped.code, Some(130), "SIG{signal}: {}", stopped.stderr);
        assert!(stopped.stderr.contains("interrupted"), "{}", stopped.stderr);
    }
}

/// Writes into `pipe` until it is full (it is made non-blocking for that, then blocking
/// again, as hallmark will find it).
fn fill(pipe: &mut std::io::PipeWriter) -> bool {
    use std::os::fd::AsRawFd as _;
    let fd = pipe.as_raw_fd();
    // SAFETY: fcntl on a descriptor this test owns.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) };
    let chunk = [b'x'; 4096];
    while pipe.write(&chunk).is_ok() {}
    unsafe { libc::fcntl(fd, libc::F_SETFL, flags) };
    true
}

/// `distribute`, `verify` and `status` with one node whose engine froze on their request and
/// one that answers, stopped by each signal: the table prints, the frozen node's rows say
/// `interrupted`, exit 130.
#[test]
fn engine_verbs_stopped_by_either_signal_print_their_table_with_interrupted_rows() {
    use std::os::unix::net::{UnixListener, UnixStream};
    let testbed = Testbed::get();
    let project = support::ship_project(1, "signals");
    let shared = testbed.config();
    project
        .with_config(&shared)
        .run(&["-q", "build", "wrap"])
        .success();
    let node = testbed.nodes()[0].clone();
    let builder = testbed.endpoint("builder");
    let healthy = testbed.endpoint(&node);
    let target = healthy.strip_prefix("unix://").unwrap().to_string();
    let cases: [(&str, &[&str]); 3] = [
        ("distribute", &["distribute", "wrap"]),
        ("verify", &["verify", "wrap"]),
        ("status", &["status"]),
    ];
    for (verb, args) in cases {
        for signal in SIGNALS {
            let name = format!("frozen-{verb}-{}", signal.to_lowercase());
            let socket = project.root().join(format!("{name}.sock"));
            let listener = UnixListener::bind(&socket).unwrap();
            let target = target.clone();
            // Frozen at its first question about images: after the connection's handshake.
            let frozen: Arc<AtomicBool> = freezing_proxy_either_way(
                move || listener.accept().ok().map(|(s, _)| s),
                move || UnixStream::connect(&target).ok(),
                (u64::MAX, u64::MAX),
                Some("/images/"),
            );
            let config = project.root().join(format!("{name}.toml"));
            std::fs::write(
                &config,
                format!(
                    "[builder]\nname = \"builder\"\nengine = \"{builder}\"\n\n[[node]]\nname = \"{node}\"\nengine = \"{healthy}\"\n\n[[node]]\nname = \"{name}\"\nengine = \"unix://{}\"\n",
                    socket.display()
                ),
            )
            .unwrap();
            let command = hallmark(&project, Some(&config), args);
            let stopped = stop(command, signal, || frozen.load(Ordering::SeqCst));
            let said = format!("{verb} SIG{signal}:\n{}{}", stopped.stdout, stopped.stderr);
            assert_eq!(stopped.code, Some(130), "{said}");
            let frozen_row = stopped.stdout.lines().find(|l| l.contains(&name));
            assert!(
                frozen_row.is_some_and(|l| l.contains("interrupted")),
                "{said}"
            );
        }
    }
}

/// Issue 40: a first copy stopped by a signal mid-way, on either transport, is resumed by
/// the next run. node1 and node2 (Docker 26 and 28) got the image before the signal; node3
/// (Docker 20.10) froze mid-way, behind a proxy: during its load (stream, serial), or as it
/// began its pull (registry, one pull at a time). The stopped run's table says what node1
/// and node2 got and `interrupted` for node3 only; the next run skips node1 and node2 and
/// sends node3 the image, and on the registry puts no blob into the registry again.
#[test]
fn a_first_copy_stopped_midway_is_resumed_by_the_next_run() {
    use std::os::unix::net::{UnixListener, UnixStream};
    let testbed = Testbed::get();
    let builder = testbed.endpoint("builder");
    for (transport, signal) in [("stream", "INT"), ("registry", "TERM")] {
        let project = support::ship_project(8, transport);
        let spec = project.read("images/base/image.toml");
        let unique = format!("/base-{}.bin", support::unique());
        project.write(
            "images/base/image.toml",
            &spec.replace("/base.bin", &unique),
        );
        let (registry, got, frozen_at) = match transport {
            "stream" => (String::new(), ["full", "thin"], (2 * support::MIB, None)),
            _ => (
                format!(
                    "transport = \"registry\"\n[registry]\nport = {}\npulls = 1\n",
                    support::free_port()
                ),
                ["pulled", "pulled"],
                (u64::MAX, Some("/images/create")),
            ),
        };
        let cluster = |node3: &str| {
            let nodes: String = [
                ("node1", testbed.endpoint("node1")),
                ("node2", testbed.endpoint("node2")),
            ]
            .iter()
            .map(|(name, engine)| format!("[[node]]\nname = \"{name}\"\nengine = \"{engine}\"\n\n"))
            .collect();
            format!(
                "{registry}\n[builder]\nname = \"builder\"\nengine = \"{builder}\"\n\n{nodes}[[node]]\nname = \"node3\"\nengine = \"{node3}\"\n"
            )
        };
        let socket = project.root().join("node3.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        let behind = testbed
            .endpoint("node3")
            .strip_prefix("unix://")
            .unwrap()
            .to_string();
        let frozen = freezing_proxy_either_way(
            move || listener.accept().ok().map(|(s, _)| s),
            move || UnixStream::connect(&behind).ok(),
            (frozen_at.0, u64::MAX),
            frozen_at.1,
        );
        let proxied = project.root().join("proxied.toml");
        std::fs::write(&proxied, cluster(&format!("unix://{}", socket.display()))).unwrap();
        let direct = project.root().join("direct.toml");
        std::fs::write(&direct, cluster(&testbed.endpoint("node3"))).unwrap();
        let built = hallmark(&project, Some(&direct), &["-q", "build", "base"])
            .status()
            .unwrap();
        assert!(built.success());

        let stopped = stop(
            hallmark(
                &project,
                Some(&proxied),
                &["--json", "-v", "distribute", "base"],
            ),
            signal,
            || frozen.load(Ordering::SeqCst),
        );
        let said = format!(
            "{transport} SIG{signal}:\n{}{}",
            stopped.stdout, stopped.stderr
        );
        assert_eq!(stopped.code, Some(130), "{said}");
        let report: serde_json::Value = support::document(&stopped.stdout);
        let action = |report: &serde_json::Value, node: &str| {
            let row =
                support::row(&serde_json::Value::Array(support::nodes_of(report)), node).clone();
            row["action"].as_str().unwrap_or_default().to_string()
        };
        for node in ["node1", "node2"] {
            assert!(
                got.contains(&action(&report, node).as_str()),
                "{node}: {said}"
            );
        }
        assert_eq!(action(&report, "node3"), "interrupted", "{said}");

        let resumed = hallmark(
            &project,
            Some(&direct),
            &["--json", "-v", "distribute", "base"],
        )
        .stderr(Stdio::piped())
        .output()
        .unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&resumed.stdout),
            String::from_utf8_lossy(&resumed.stderr),
        );
        let said = format!("{transport} resumed:\n{stdout}{stderr}");
        assert_eq!(resumed.status.code(), Some(0), "{said}");
        let report: serde_json::Value = support::document(&stdout);
        assert_eq!(action(&report, "node1"), "skipped", "{said}");
        assert_eq!(action(&report, "node2"), "skipped", "{said}");
        assert!(got.contains(&action(&report, "node3").as_str()), "{said}");
        if transport == "registry" {
            assert!(
                stderr.contains(": 0 blobs linked, 0 blobs sent"),
                "the registry kept the image: {said}"
            );
        }
        testbed.run_container(
            "node3",
            &support::reference(&project, "base"),
            &["test", "-s", &unique],
        );
    }
}
