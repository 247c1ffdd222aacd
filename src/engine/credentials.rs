//! Registry credentials the way the docker CLI keeps them, for pushes and pulls through an
//! operator's registry: `credHelpers` of `config.json` for that registry, else its
//! `credsStore`, else the `auths` entry. A helper is the docker CLI's own protocol
//! (`docker-credential-<name> get`, the registry on stdin, JSON on stdout).
//!
//! Written here rather than with the docker_credential crate (1.4, which reads the same three
//! places): its error for a failing helper carries the helper's stdout, where a helper may
//! have written the secret, and it waits for a helper without a deadline; here a helper that
//! does not answer within `HALLMARK_ANSWER_TIMEOUT` (60 s) is killed and named.
//!
//! The secret goes into the engine request's `X-Registry-Auth` header and nowhere else: it
//! is never printed, logged or put into an error (tests/it/registry.rs holds a sentinel).

use crate::error::{Error, Result};
use base64::Engine as _;
use serde_json::Value;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The docker CLI's config folder: `DOCKER_CONFIG`, else `~/.docker`.
pub fn docker_config_dir() -> PathBuf {
    let env = |key: &str| std::env::var(key).ok().filter(|v| !v.is_empty());
    env("DOCKER_CONFIG")
        .map(PathBuf::from)
        .or_else(|| env("HOME").map(|home| Path::new(&home).join(".docker")))
        .unwrap_or_else(|| PathBuf::from(".docker"))
}

/// What the docker CLI would send to a registry: a user and password, or an identity token.
/// The engine module turns it into the request's `X-Registry-Auth` header.
#[derive(Clone, Default)]
pub struct Credentials {
    /// `host:port`.
    pub registry: String,
    pub username: Option<String>,
    pub password: Option<String>,
    pub identity_token: Option<String>,
}

/// Never the secret: only which parts there are.
impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("registry", &self.registry)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<secret>"))
            .field(
                "identity_token",
                &self.identity_token.as_ref().map(|_| "<secret>"),
            )
            .finish()
    }
}

/// The credentials the docker CLI would send to `registry` (`host:port`), if it has any.
pub fn for_registry(registry: &str) -> Result<Option<Credentials>> {
    let file = docker_config_dir().join("config.json");
    let config = match fs_err::read_to_string(&file) {
        Ok(text) => serde_json::from_str::<Value>(&text).map_err(|e| Error::Parse {
            path: file.clone(),
            location: None,
            key: None,
            message: format!("not the docker CLI's JSON config: {e}"),
        })?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(&file, e)),
    };
    let helper = config["credHelpers"][registry]
        .as_str()
        .or_else(|| config["credsStore"].as_str())
        .filter(|h| !h.is_empty());
    if let Some(helper) = helper {
        return from_helper(helper, registry);
    }
    let auths = config["auths"].as_object();
    let entry = auths.and_then(|auths| {
        auths
            .iter()
            .find(|(key, _)| same_registry(key, registry))
            .map(|(_, entry)| entry)
    });
    let Some(entry) = entry else {
        return Ok(None);
    };
    from_auths_entry(entry, registry, &file).map(Some)
}

/// `https://host:port/v1/` and `host:port` name the same registry in `auths`.
fn same_registry(key: &str, registry: &str) -> bool {
    let bare = key
        .trim_start_matches("https://")
        .trim_start_matches("http://");
    bare.split('/').next() == Some(registry)
}

fn from_auths_entry(entry: &Value, registry: &str, file: &Path) -> Result<Credentials> {
    let mut credentials = Credentials {
        registry: registry.to_string(),
        identity_token: entry["identitytoken"].as_str().map(String::from),
        ..Default::default()
    };
    if let Some(auth) = entry["auth"].as_str().filter(|a| !a.is_empty()) {
        let invalid = || Error::Parse {
            path: file.to_path_buf(),
            location: None,
            key: Some(format!("auths.{registry}.auth")),
            // Never the value: it is the secret.
            message: "not base64 of `user:password`".into(),
        };
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(auth)
            .map_err(|_| invalid())?;
        let decoded = String::from_utf8(decoded).map_err(|_| invalid())?;
        let (user, password) = decoded.split_once(':').ok_or_else(invalid)?;
        credentials.username = Some(user.to_string());
        credentials.password = Some(password.to_string());
    }
    Ok(credentials)
}

/// Asks `docker-credential-<helper>` for `registry`'s credentials.
fn from_helper(helper: &str, registry: &str) -> Result<Option<Credentials>> {
    let limit = super::transport::seconds_from_env(super::transport::ANSWER_TIMEOUT_ENV, 60);
    ask_helper(&format!("docker-credential-{helper}"), registry, limit)
}

/// Runs the helper `program` for `registry`, waiting at most `limit`.
fn ask_helper(
    program: &str,
    registry: &str,
    limit: std::time::Duration,
) -> Result<Option<Credentials>> {
    let failed = |message: String| Error::Command {
        command: format!("{program} get"),
        context: Some(format!("credentials for the registry {registry}")),
        stderr: message,
    };
    let mut child = Command::new(program)
        .arg("get")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| failed(format!("cannot run the docker credential helper: {e}")))?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(registry.as_bytes());
    }
    // A helper that never answers (a locked keychain asking on no terminal) would hang the
    // distribute: it gets the engines' answer deadline, then is killed.
    let pid = child.id();
    let (sender, answer) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = sender.send(child.wait_with_output());
    });
    let output = match answer.recv_timeout(limit) {
        Ok(output) => {
            output.map_err(|e| failed(format!("the docker credential helper failed: {e}")))?
        }
        Err(_) => {
            // SAFETY: kill(2) on the helper's own pid, a child not yet reaped (its waiter
            // still waits), so the pid is not reused.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            return Err(failed(format!(
                "it did not answer within {} s ({} sets how long to wait); it was stopped",
                limit.as_secs(),
                super::transport::ANSWER_TIMEOUT_ENV
            )));
        }
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        // The helpers' own way of saying "none stored", on stdout.
        if stdout.contains("credentials not found") {
            return Ok(None);
        }
        return Err(failed(format!(
            "exit {}: {}",
            output.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    let answer: Value = serde_json::from_str(&stdout)
        .map_err(|_| failed("its answer is not the helpers' JSON".into()))?;
    let user = answer["Username"].as_str().unwrap_or_default();
    let secret = answer["Secret"].as_str().unwrap_or_default().to_string();
    let mut credentials = Credentials {
        registry: registry.to_string(),
        ..Default::default()
    };
    // A helper says a secret is an identity token by the user name `<token>`.
    if user == "<token>" {
        credentials.identity_token = Some(secret);
    } else {
        credentials.username = Some(user.to_string());
        credentials.password = Some(secret);
    }
    Ok(Some(credentials))
}

#[cfg(test)]
mod tests {
    use super::ask_helper;

    /// A helper script in a folder of its own, written by a child process (`sh -c 'cat >
    /// FILE'`): a file this process opened for writing could be held open by a fork another
    /// test thread makes meanwhile, and running it would then fail with ETXTBSY.
    fn helper(script: &str) -> (tempfile::TempDir, String) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("docker-credential-test");
        let program = path.to_str().unwrap().to_string();
        let mut writer = std::process::Command::new("sh")
            .args(["-c", "cat > \"$1\" && chmod 755 \"$1\"", "sh", &program])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::io::Write::write_all(
            &mut writer.stdin.take().unwrap(),
            format!("#!/bin/sh\n{script}\n").as_bytes(),
        )
        .unwrap();
        assert!(writer.wait().unwrap().success());
        (dir, program)
    }

    /// CI saw `Text file busy (os error 26)` running a helper just written: a fork made by
    /// another test thread while the file was open for writing held the write descriptor.
    /// Helpers written while other threads fork all the time run, every one.
    #[test]
    fn a_helper_written_while_other_threads_fork_runs() {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let forkers: Vec<_> = (0..3)
            .map(|_| {
                let stop = std::sync::Arc::clone(&stop);
                std::thread::spawn(move || {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let _ = std::process::Command::new("true").status();
                    }
                })
            })
            .collect();
        let mut failures = Vec::new();
        for _ in 0..200 {
            let (_dir, program) = helper("exit 0");
            if let Err(e) = std::process::Command::new(&program).status() {
                failures.push(e.to_string());
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for forker in forkers {
            forker.join().unwrap();
        }
        assert!(
            failures.is_empty(),
            "{} of 200: {:?}",
            failures.len(),
            failures.first()
        );
    }

    #[test]
    fn a_helper_that_never_answers_is_stopped_at_the_deadline() {
        let (_dir, program) = helper("exec sleep 600");
        let error = ask_helper(
            &program,
            "r.example:5000",
            std::time::Duration::from_secs(1),
        )
        .unwrap_err()
        .render();
        assert!(error.contains("did not answer within 1 s"), "{error}");
    }

    #[test]
    fn a_failing_helper_s_stdout_stays_out_of_the_error() {
        let (_dir, program) =
            helper("echo '{\"Secret\": \"SENTINEL-7f3a\"}'; echo refused >&2; exit 3");
        let error = ask_helper(
            &program,
            "r.example:5000",
            std::time::Duration::from_secs(60),
        )
        .unwrap_err()
        .render();
        assert!(error.contains("exit 3: refused"), "{error}");
        assert!(!error.contains("SENTINEL-7f3a"), "{error}");
    }

    use super::*;

    #[test]
    fn an_auths_entry_is_found_by_host_and_port_in_any_spelling() {
        assert!(same_registry(
            "https://reg.example:5000/v1/",
            "reg.example:5000"
        ));
        assert!(same_registry("reg.example:5000", "reg.example:5000"));
        assert!(!same_registry("reg.example", "reg.example:5000"));
        let entry = serde_json::json!({"auth": "b3BlcmF0b3I6czNjcmV0OndpdGg6Y29sb25z"});
        let credentials =
            from_auths_entry(&entry, "reg.example:5000", Path::new("config.json")).unwrap();
        assert_eq!(credentials.username.as_deref(), Some("operator"));
        assert_eq!(credentials.password.as_deref(), Some("s3cret:with:colons"));
        let broken = serde_json::json!({"auth": "!!not base64 s3cret"});
        let error = from_auths_entry(&broken, "r:1", Path::new("config.json")).unwrap_err();
        assert!(!error.render().contains("s3cret"), "{}", error.render());
    }
}
