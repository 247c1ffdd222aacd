//! Smoke tests as the operator runs them: a command in a fresh container, or a process kept
//! running (a served model) with probes run inside it (`docker exec`), against 127.0.0.1, so
//! no network outside the container is needed. Boot options (environment, node paths, shared
//! memory, IPC, ulimits, user) go into the container as `docker run` would put them. The
//! container is removed whatever happens (pass, fail, deadline, Ctrl-C: it is in the live
//! list from its creation).

use super::Engine;
use crate::error::Result;
use bollard::container::LogOutput;
use bollard::exec::StartExecResults;
use bollard::query_parameters::LogsOptionsBuilder;
use futures_util::StreamExt;
use std::time::{Duration, Instant};

/// What to run, in engine terms (the spec's `[[smoke]]` made concrete by `make`).
#[derive(Debug, Clone, Default)]
pub struct SmokeRun {
    /// The command; with `served`, the probe run once the process is ready.
    pub command: Vec<String>,
    pub served: Option<Served>,
    /// `KEY=value`.
    pub env: Vec<String>,
    pub mounts: Vec<Mount>,
    pub shm_size: Option<i64>,
    pub ipc: Option<String>,
    /// Name, and the soft and hard limit alike.
    pub ulimits: Vec<(String, i64)>,
    pub user: Option<String>,
}

#[derive(Debug, Clone, Default)]
pub struct Served {
    /// The process's argv; `None`: the image's own entrypoint and cmd.
    pub argv: Option<Vec<String>>,
    /// With the image's own entrypoint: its cmd replaced by these.
    pub args: Option<Vec<String>>,
    /// Run inside until it exits 0.
    pub ready: Option<Vec<String>>,
    /// How long the process may take to be ready.
    pub within: Duration,
}

#[derive(Debug, Clone)]
pub struct Mount {
    pub source: String,
    pub target: String,
    pub readonly: bool,
}

/// How a smoke test ended.
#[derive(Debug, Clone, Default)]
pub struct SmokeOutcome {
    pub code: i64,
    /// Standard output and error, interleaved.
    pub output: String,
    /// Standard output alone (what `expect` matches).
    pub stdout: String,
    /// The served process's last 50 lines of output.
    pub logs: Vec<String>,
    /// Why it failed before the command ran (never ready, exited early), if it did.
    pub failure: Option<String>,
}

/// How long to wait between readiness probes.
const READY_EVERY: Duration = Duration::from_secs(1);

impl Engine {
    /// Runs one smoke test from `image`; the container is removed whatever happens.
    pub async fn run_smoke(&self, image: &str, run: &SmokeRun) -> Result<SmokeOutcome> {
        let id = self.create_container(create_body(image, run)).await?;
        let outcome = match &run.served {
            None => self
                .run_created(&id)
                .await
                .map(|(code, output, stdout)| SmokeOutcome {
                    code,
                    output,
                    stdout,
                    ..SmokeOutcome::default()
                }),
            Some(served) => self.serve_and_probe(&id, served, &run.command).await,
        };
        self.remove_container(&id).await;
        outcome
    }

    async fn serve_and_probe(
        &self,
        id: &str,
        served: &Served,
        probe: &[String],
    ) -> Result<SmokeOutcome> {
        self.start_container(id).await?;
        let deadline = Instant::now() + served.within;
        if let Some(ready) = &served.ready {
            loop {
                if let Some(code) = self.exited(id).await? {
                    return Ok(self
                        .failed(
                            id,
                            code,
                            format!("the served process exited with {code} before it was ready"),
                        )
                        .await);
                }
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Ok(self
                        .failed(
                            id,
                            -1,
                            format!(
                                "not ready in {} s: `{}` never exited 0",
                                served.within.as_secs(),
                                ready.join(" ")
                            ),
                        )
                        .await);
                }
                if let Ok(Ok((0, _, _))) = tokio::time::timeout(left, self.exec(id, ready)).await {
                    break;
                }
                tokio::time::sleep(READY_EVERY.min(left)).await;
            }
        }
        let limit = super::smoke_timeout();
        let probed = tokio::time::timeout(limit, self.exec(id, probe)).await;
        let (code, output, stdout) = match probed {
            Ok(answer) => answer?,
            Err(_) => {
                return Ok(self
                    .failed(
                        id,
                        -1,
                        format!(
                            "`{}` did not end in {} s ({} sets how long)",
                            probe.join(" "),
                            limit.as_secs(),
                            super::SMOKE_TIMEOUT_ENV
                        ),
                    )
                    .await);
            }
        };
        Ok(SmokeOutcome {
            code,
            output,
            stdout,
            logs: self.last_lines(id, 50).await,
            failure: None,
        })
    }

    /// The outcome of a served test that failed before its probe: why, and the logs.
    async fn failed(&self, id: &str, code: i64, why: String) -> SmokeOutcome {
        SmokeOutcome {
            code,
            logs: self.last_lines(id, 50).await,
            failure: Some(why),
            ..SmokeOutcome::default()
        }
    }

    /// The exit code, when the container has stopped.
    async fn exited(&self, id: &str) -> Result<Option<i64>> {
        let inspect = self.docker.inspect_container(
            id,
            None::<bollard::query_parameters::InspectContainerOptions>,
        );
        let inspected = self
            .answered(&format!("inspecting container {id}"), inspect)
            .await?;
        let state = inspected.state.unwrap_or_default();
        Ok(match state.running {
            Some(true) => None,
            _ => Some(state.exit_code.unwrap_or(-1)),
        })
    }

    /// Runs `argv` inside the running container: its exit code, output, and stdout alone.
    async fn exec(&self, id: &str, argv: &[String]) -> Result<(i64, String, String)> {
        let config = bollard::models::ExecConfig {
            cmd: Some(argv.to_vec()),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            ..Default::default()
        };
        let what = format!("running `{}` in container {id}", argv.join(" "));
        let created = self
            .answered(&what, self.docker.create_exec(id, config))
            .await?;
        let started = self
            .answered(&what, self.docker.start_exec(&created.id, None))
            .await?;
        let (mut output, mut stdout) = (String::new(), String::new());
        if let StartExecResults::Attached {
            output: mut stream, ..
        } = started
        {
            // Bounded by the caller's deadline: a probe that hangs is the test's failure.
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(|e| self.error(format!("{what}: {e}")))?;
                if let LogOutput::StdOut { message } | LogOutput::Console { message } = &chunk {
                    stdout.push_str(&String::from_utf8_lossy(message));
                }
                output.push_str(&chunk.to_string());
            }
        }
        let inspected = self
            .answered(&what, self.docker.inspect_exec(&created.id))
            .await?;
        Ok((inspected.exit_code.unwrap_or(-1), output, stdout))
    }

    /// The container's last `n` lines of output (none when they cannot be read).
    async fn last_lines(&self, id: &str, n: usize) -> Vec<String> {
        let options = LogsOptionsBuilder::new()
            .stdout(true)
            .stderr(true)
            .tail(&n.to_string())
            .build();
        let mut logs = self.docker.logs(id, Some(options));
        let mut text = String::new();
        let what = format!("reading the output of container {id}");
        while let Ok(Some(chunk)) = self
            .answered(&what, async { logs.next().await.transpose() })
            .await
        {
            text.push_str(&chunk.to_string());
        }
        text.lines().map(str::to_string).collect()
    }
}

/// The create document: `docker run` of the test, no network but the loopback.
fn create_body(image: &str, run: &SmokeRun) -> serde_json::Value {
    let mut host = serde_json::json!({"NetworkMode": "none"});
    if !run.mounts.is_empty() {
        host["Mounts"] = run
            .mounts
            .iter()
            .map(|m| {
                serde_json::json!({
                    "Type": "bind", "Source": m.source, "Target": m.target, "ReadOnly": m.readonly,
                })
            })
            .collect();
    }
    if let Some(size) = run.shm_size {
        host["ShmSize"] = size.into();
    }
    if let Some(ipc) = &run.ipc {
        host["IpcMode"] = ipc.as_str().into();
    }
    if !run.ulimits.is_empty() {
        host["Ulimits"] = run
            .ulimits
            .iter()
            .map(|(name, n)| serde_json::json!({"Name": name, "Soft": n, "Hard": n}))
            .collect();
    }
    let mut body = serde_json::json!({
        "Image": image,
        "NetworkDisabled": true,
        "HostConfig": host,
    });
    match &run.served {
        None => {
            body["Cmd"] = run.command.clone().into();
            body["Entrypoint"] = serde_json::json!([]);
        }
        Some(Served {
            argv: Some(argv), ..
        }) => {
            body["Cmd"] = argv.clone().into();
            body["Entrypoint"] = serde_json::json!([]);
        }
        Some(Served {
            argv: None, args, ..
        }) => {
            if let Some(args) = args {
                body["Cmd"] = args.clone().into();
            }
        }
    }
    if !run.env.is_empty() {
        body["Env"] = run.env.clone().into();
    }
    if let Some(user) = &run.user {
        body["User"] = user.as_str().into();
    }
    body
}
