//! Smoke tests as the operator runs them: a command in a fresh container, or a process kept
//! running (a served model) with probes run inside it (`docker exec`), against 127.0.0.1, so
//! no network outside the container is needed. Boot options (environment, node paths, shared
//! memory, IPC, ulimits, user) go into the container as `docker run` would put them. The
//! container is removed whatever happens (pass, fail, deadline, Ctrl-C: it is in the live
//! list from its creation).

use super::Engine;
use crate::error::Result;
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
    pub gpus: Option<Gpus>,
}

/// GPUs a test asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gpus {
    All,
    Count(u32),
    /// CDI device names: `nvidia.com/gpu=0`.
    Named(Vec<String>),
}

/// How an engine gives devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceWay {
    /// CDI device names (`DeviceRequests` with driver `cdi`).
    Cdi,
    /// The NVIDIA runtime's request (`capabilities [["gpu"]]`): an engine with no CDI.
    Nvidia,
    /// CDI device names in the libpod API's create document (`devices`): Podman, whose
    /// Docker-compatible API ignores both `DeviceRequests` and CDI names in `Devices` (seen on
    /// 4.3: the test ran without the device, and an unknown name passed).
    Libpod,
}

/// Podman's own create endpoint (the libpod API; 4.x and 5.x answer at this version).
const LIBPOD_CREATE: &str = "/v4.0.0/libpod/containers/create";

impl Gpus {
    /// `HostConfig.DeviceRequests` for this request, the engine giving devices `way`.
    /// (`Libpod` takes no device requests: its devices are `cdi_names` in `devices`.)
    pub fn device_requests(&self, way: DeviceWay) -> serde_json::Value {
        match way {
            DeviceWay::Cdi | DeviceWay::Libpod => {
                serde_json::json!([{"Driver": "cdi", "DeviceIDs": self.cdi_names()}])
            }
            DeviceWay::Nvidia => {
                let mut request =
                    serde_json::json!({"Driver": "nvidia", "Capabilities": [["gpu"]]});
                match self {
                    Gpus::All => request["Count"] = (-1).into(),
                    Gpus::Count(n) => request["Count"] = (*n).into(),
                    Gpus::Named(names) => {
                        // The NVIDIA runtime names devices by index or UUID: the part after `=`.
                        let ids: Vec<&str> = names
                            .iter()
                            .map(|n| n.rsplit('=').next().unwrap_or(n))
                            .collect();
                        request["DeviceIDs"] = ids.into();
                    }
                }
                serde_json::json!([request])
            }
        }
    }

    /// The CDI device names asked for: `nvidia.com/gpu=all`, `=0`, `=1`...
    pub fn cdi_names(&self) -> Vec<String> {
        match self {
            Gpus::All => vec!["nvidia.com/gpu=all".into()],
            Gpus::Count(n) => (0..*n).map(|i| format!("nvidia.com/gpu={i}")).collect(),
            Gpus::Named(names) => names.clone(),
        }
    }

    pub fn words(&self) -> String {
        match self {
            Gpus::All => "all GPUs".into(),
            Gpus::Count(n) => format!("{n} GPU(s)"),
            Gpus::Named(names) => names.join(", "),
        }
    }
}

/// How a Docker engine gives GPUs, chosen by what it can give, not by what it is set up with:
/// Docker 28.3+ reads CDI by default and lists the CDI devices it found; with none found for
/// NVIDIA GPUs (no `nvidia-ctk cdi generate` was run) and an `nvidia` runtime, the runtime is
/// the way that reaches them. An engine without CDI spec dirs and with the runtime, the same.
fn docker_device_way(info: &super::EngineInfo, version: &super::EngineVersion) -> DeviceWay {
    let nvidia_cdi = info.discovered_devices.iter().any(|d| {
        d.get("ID")
            .and_then(serde_json::Value::as_str)
            .is_some_and(|id| id.starts_with("nvidia.com/gpu="))
    });
    let lists_devices = version.at_least(28, 3);
    let runtime = info.runtimes.contains_key("nvidia");
    match runtime && (info.cdi_spec_dirs.is_empty() || (lists_devices && !nvidia_cdi)) {
        true => DeviceWay::Nvidia,
        false => DeviceWay::Cdi,
    }
}

/// What a node lacks, in plain words, from the engine's refusal of a device request.
pub fn lacking(way: DeviceWay, engine_said: &str) -> String {
    let said = engine_said.to_ascii_lowercase();
    match way {
        DeviceWay::Nvidia if said.contains("could not select device driver") => format!(
            "no NVIDIA runtime (the engine has no CDI and no `nvidia` device driver): {engine_said}"
        ),
        DeviceWay::Cdi | DeviceWay::Libpod if said.contains("unresolvable cdi devices") => {
            format!(
                "no CDI device of that name (on an NVIDIA node, `nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml` writes the spec of its GPUs): {engine_said}"
            )
        }
        DeviceWay::Cdi
            if said.contains("could not select device driver") || said.contains("cdi") =>
        {
            format!(
                "no CDI (a Docker before 28.3 needs its `cdi` feature and spec dirs): {engine_said}"
            )
        }
        _ => engine_said.to_string(),
    }
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
        let argv = self.smoke_argv(image, run).await?;
        let (created, way) = match &run.gpus {
            None => (
                self.create_container(create_body(image, run, &argv)).await,
                None,
            ),
            Some(gpus) => {
                let way = self.device_way().await?;
                let created = if way == DeviceWay::Libpod {
                    let body = libpod_body(image, run, gpus, &argv);
                    self.create_container_at(LIBPOD_CREATE, body, image).await
                } else {
                    let mut body = create_body(image, run, &argv);
                    body["HostConfig"]["DeviceRequests"] = gpus.device_requests(way);
                    self.create_container(body).await
                };
                (created, Some(way))
            }
        };
        let id = match (created, way, &run.gpus) {
            (Ok(id), _, _) => id,
            (Err(crate::error::Error::Engine { message, .. }), Some(way), Some(gpus)) => {
                return Err(self.error(format!(
                    "cannot give {}: {}",
                    gpus.words(),
                    lacking(way, &message)
                )));
            }
            (Err(e), _, _) => return Err(e),
        };
        // Docker checks CDI names only when the container starts: a start refused for devices
        // is said as what the node lacks.
        if let Err(e) = self.start_container(&id).await {
            self.remove_container(&id).await;
            return Err(match (e, way, &run.gpus) {
                (crate::error::Error::Engine { message, .. }, Some(way), Some(gpus)) => self.error(
                    format!("cannot give {}: {}", gpus.words(), lacking(way, &message)),
                ),
                (e, _, _) => e,
            });
        }
        let outcome = match &run.served {
            None => self
                .finished(&id)
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

    /// The argv the test's container runs, worked out here rather than left to the engine
    /// (whose defaults differ: `containers::run_exactly`): `run`, or `serve`'s argv, or the
    /// image's entrypoint followed by `args` (by its cmd without `args`), as `docker run IMAGE
    /// [ARGS...]` composes them. `args = []` means no arguments, not the image's cmd.
    async fn smoke_argv(&self, image: &str, run: &SmokeRun) -> Result<Vec<String>> {
        let args = match &run.served {
            None => return Ok(run.command.clone()),
            Some(Served {
                argv: Some(argv), ..
            }) => return Ok(argv.clone()),
            Some(Served {
                argv: None, args, ..
            }) => args,
        };
        let answer = match self.run_as_typed(image).await? {
            Some(answer) => Some(answer),
            None => self.inspect(image).await?,
        };
        let Some(answer) = answer else {
            return Err(self.error(format!("no such image: {image}")));
        };
        let mut argv = answer.strings("Entrypoint").unwrap_or_default();
        match args {
            Some(args) => argv.extend(args.iter().cloned()),
            None => argv.extend(answer.strings("Cmd").unwrap_or_default()),
        }
        if argv.is_empty() {
            return Err(self.error(format!(
                "{image} has no entrypoint and no cmd: `serve = true` has nothing to run (give `serve` an argv)"
            )));
        }
        Ok(argv)
    }

    /// How this engine gives GPUs: Podman through its own API; a Docker engine with the
    /// NVIDIA runtime and no CDI spec dirs the NVIDIA request, any other CDI names.
    async fn device_way(&self) -> Result<DeviceWay> {
        if self.product() == super::kind::Product::Podman {
            return Ok(DeviceWay::Libpod);
        }
        let info = self.info().await?;
        Ok(docker_device_way(&info, &self.version))
    }

    async fn serve_and_probe(
        &self,
        id: &str,
        served: &Served,
        probe: &[String],
    ) -> Result<SmokeOutcome> {
        if let Some(failed) = self.wait_ready(id, served).await? {
            return Ok(failed);
        }
        let limit = super::smoke_timeout();
        let probed = tokio::time::timeout(limit, self.exec(id, probe)).await;
        // A served process that died while it was probed is the server's failure (its exit
        // code and last lines), not the probe's, whatever the probe answered. A probe that
        // did not pass may have been ended by that very death (137: killed with its
        // container), before the engine says the container stopped: asked to wait for it, a
        // few seconds at most.
        let probe_passed = matches!(probed, Ok(Ok((0, _, _))));
        if let Some(code) = self.server_exit(id, !probe_passed).await? {
            return Ok(self
                .failed(
                    id,
                    code,
                    format!(
                        "the served process exited with {code} while `{}` ran",
                        probe.join(" ")
                    ),
                )
                .await);
        }
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

    /// Waits for a served process to be ready (its `ready` probe exits 0): `None` once it is,
    /// or the failed outcome (it exited, its deadline passed, the probe cannot run at all).
    async fn wait_ready(&self, id: &str, served: &Served) -> Result<Option<SmokeOutcome>> {
        let deadline = Instant::now() + served.within;
        let Some(ready) = &served.ready else {
            return Ok(None);
        };
        loop {
            if let Some(code) = self.exited(id).await? {
                return Ok(Some(
                    self.failed(
                        id,
                        code,
                        format!("the served process exited with {code} before it was ready"),
                    )
                    .await,
                ));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(Some(
                    self.failed(
                        id,
                        -1,
                        format!(
                            "not ready in {} s: `{}` never exited 0",
                            served.within.as_secs(),
                            ready.join(" ")
                        ),
                    )
                    .await,
                ));
            }
            match tokio::time::timeout(left, self.exec(id, ready)).await {
                Ok(Ok((0, _, _))) => return Ok(None),
                // 126 and 127: the program cannot run, or is not in the image: asking
                // again until the deadline (45 minutes for a vLLM boot) cannot help.
                Ok(Ok((code @ (126 | 127), output, _))) if self.exited(id).await?.is_none() => {
                    return Ok(Some(self
                            .failed(
                                id,
                                code,
                                format!(
                                    "the ready probe `{}` cannot run in the image (exit {code}: not there, or not executable): {}",
                                    ready.join(" "),
                                    output.trim()
                                ),
                            )
                            .await));
                }
                _ => {}
            }
            tokio::time::sleep(READY_EVERY.min(left)).await;
        }
    }

    /// The served container's exit code if it has stopped; with `settle`, it is given a few
    /// seconds to stop (the wait API answers when it does), for a probe its death may have
    /// ended before the engine recorded it.
    async fn server_exit(&self, id: &str, settle: bool) -> Result<Option<i64>> {
        if !settle {
            return self.exited(id).await;
        }
        const SETTLE: Duration = Duration::from_secs(5);
        let path = format!("/containers/{id}/wait");
        let waited: std::result::Result<Option<super::ContainerExit>, _> = self
            .transport
            .post_within(&path, (SETTLE, super::SMOKE_TIMEOUT_ENV))
            .await;
        match waited {
            Ok(Some(exit)) => Ok(Some(exit.status_code)),
            // Still running after the settling time: the probe's own failure.
            _ => self.exited(id).await,
        }
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
        let mut captured = super::capture::Captured::default();
        if let StartExecResults::Attached {
            output: mut stream, ..
        } = started
        {
            // Bounded by the caller's deadline: a probe that hangs is the test's failure.
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(|e| self.error(format!("{what}: {e}")))?;
                captured.push(&chunk);
            }
        }
        let (output, stdout) = captured.into_texts();
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
        // `n` lines may be long ones: their last 64 KiB.
        let mut text = super::capture::Tail::new(super::capture::OUTPUT_TAIL);
        let what = format!("reading the output of container {id}");
        while let Ok(Some(chunk)) = self
            .answered(&what, async { logs.next().await.transpose() })
            .await
        {
            text.push(chunk.as_ref());
        }
        text.into_text().lines().map(str::to_string).collect()
    }
}

/// The create document: `docker run` of the test, no network but the loopback.
fn create_body(image: &str, run: &SmokeRun, argv: &[String]) -> serde_json::Value {
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
    // With the host's IPC the container's /dev/shm is the host's: Docker ignores a size then,
    // and Podman's compatible API refuses the pair ("cannot set shmsize when running in the
    // host IPC Namespace"). Left out, both run the test alike.
    if let Some(size) = run.shm_size
        && run.ipc.as_deref() != Some("host")
    {
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
    super::containers::run_exactly(&mut body, argv);
    if !run.env.is_empty() {
        body["Env"] = run.env.clone().into();
    }
    if let Some(user) = &run.user {
        body["User"] = user.as_str().into();
    }
    body
}

/// The libpod API's create document for the test: what `create_body` says, in Podman's own
/// words (its spec generator's JSON), with the devices as CDI names.
///
/// Two differences from the Docker document, both Podman's: the ulimits named replace
/// containers.conf's `default_ulimits` (Podman then sets `nofile` and `nproc` to its own
/// defaults unless the test names them), and `shm_size` is left out with `ipc = "host"`
/// (Podman refuses the pair; Docker ignores the size, the shared memory being the host's).
fn libpod_body(image: &str, run: &SmokeRun, gpus: &Gpus, argv: &[String]) -> serde_json::Value {
    let mut body = serde_json::json!({
        "image": image,
        "netns": {"nsmode": "none"},
        "devices": gpus.cdi_names().iter().map(|path| serde_json::json!({"path": path})).collect::<Vec<_>>(),
    });
    // The entrypoint is set to the argv's first word rather than emptied: Podman takes an
    // empty entrypoint as "the image's" (as `containers::run_exactly` says for Docker's API).
    if let Some((first, rest)) = argv.split_first() {
        body["entrypoint"] = serde_json::json!([first]);
        body["command"] = rest.to_vec().into();
    }
    if !run.env.is_empty() {
        let env: serde_json::Map<String, serde_json::Value> = (run.env.iter())
            .map(|kv| kv.split_once('=').unwrap_or((kv, "")))
            .map(|(k, v)| (k.to_string(), v.into()))
            .collect();
        body["env"] = env.into();
    }
    if !run.mounts.is_empty() {
        body["mounts"] = (run.mounts.iter())
            .map(|m| {
                let mode = if m.readonly { "ro" } else { "rw" };
                serde_json::json!({
                    "type": "bind", "source": m.source, "destination": m.target,
                    "options": ["rbind", mode],
                })
            })
            .collect();
    }
    match (&run.ipc, run.shm_size) {
        (Some(ipc), _) if ipc == "host" => body["ipcns"] = serde_json::json!({"nsmode": "host"}),
        (ipc, size) => {
            if let Some(ipc) = ipc {
                body["ipcns"] = serde_json::json!({"nsmode": ipc});
            }
            if let Some(size) = size {
                body["shm_size"] = size.into();
            }
        }
    }
    if !run.ulimits.is_empty() {
        body["r_limits"] = (run.ulimits.iter())
            .map(|(name, n)| {
                // Podman's limits are unsigned: Docker's -1 (unlimited) is RLIM_INFINITY.
                let n = u64::try_from(*n).unwrap_or(u64::MAX);
                serde_json::json!({"type": name, "soft": n, "hard": n})
            })
            .collect();
    }
    if let Some(user) = &run.user {
        body["user"] = user.as_str().into();
    }
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_requests_are_cdi_names_or_the_nvidia_runtimes_request() {
        let cdi = Gpus::Count(2).device_requests(DeviceWay::Cdi);
        assert_eq!(
            cdi,
            serde_json::json!([{"Driver": "cdi", "DeviceIDs": ["nvidia.com/gpu=0", "nvidia.com/gpu=1"]}])
        );
        let all = Gpus::All.device_requests(DeviceWay::Nvidia);
        assert_eq!(
            all,
            serde_json::json!([{"Driver": "nvidia", "Count": -1, "Capabilities": [["gpu"]]}])
        );
        let named = Gpus::Named(vec!["nvidia.com/gpu=1".into()]).device_requests(DeviceWay::Nvidia);
        assert_eq!(named[0]["DeviceIDs"], serde_json::json!(["1"]));
    }

    /// Podman's own create document says what Docker's does, in Podman's words: the argv's
    /// first word as the entrypoint (an empty one would be the image's), unlimited as
    /// RLIM_INFINITY, no shm size with the host's IPC (Podman refuses the pair).
    #[test]
    fn podmans_create_document_says_what_dockers_does() {
        let run = SmokeRun {
            command: vec!["sh".into(), "-c".into(), "probe".into()],
            served: Some(Served {
                argv: None,
                args: Some(vec!["--model".into(), "/m".into()]),
                ..Served::default()
            }),
            env: vec!["A=1=2".into()],
            mounts: vec![Mount {
                source: "/var/tmp/w".into(),
                target: "/w".into(),
                readonly: true,
            }],
            shm_size: Some(1 << 30),
            ipc: Some("host".into()),
            ulimits: vec![("memlock".into(), -1), ("stack".into(), 67_108_864)],
            user: Some("1000".into()),
            gpus: Some(Gpus::Count(2)),
        };
        let argv = ["/entry", "--model", "/m"].map(String::from);
        let body = libpod_body("sha256:abc", &run, run.gpus.as_ref().unwrap(), &argv);
        assert_eq!(
            body,
            serde_json::json!({
                "image": "sha256:abc",
                "netns": {"nsmode": "none"},
                "devices": [{"path": "nvidia.com/gpu=0"}, {"path": "nvidia.com/gpu=1"}],
                "entrypoint": ["/entry"],
                "command": ["--model", "/m"],
                "env": {"A": "1=2"},
                "mounts": [{"type": "bind", "source": "/var/tmp/w", "destination": "/w", "options": ["rbind", "ro"]}],
                "ipcns": {"nsmode": "host"},
                "r_limits": [
                    {"type": "memlock", "soft": u64::MAX, "hard": u64::MAX},
                    {"type": "stack", "soft": 67_108_864, "hard": 67_108_864},
                ],
                "user": "1000",
            })
        );
        let plain = SmokeRun {
            command: vec!["test".into(), "-c".into(), "/dev/nvidia0".into()],
            shm_size: Some(64),
            ..SmokeRun::default()
        };
        let body = libpod_body("i", &plain, &Gpus::All, &plain.command);
        assert_eq!(body["entrypoint"], serde_json::json!(["test"]));
        assert_eq!(body["command"], serde_json::json!(["-c", "/dev/nvidia0"]));
        assert_eq!(body["shm_size"], 64);
        assert_eq!(
            body["devices"],
            serde_json::json!([{"path": "nvidia.com/gpu=all"}])
        );
    }

    /// Docker's create document names the whole argv, never an empty entrypoint (Podman's
    /// compat API takes one as the image's) and never an empty cmd with an unset entrypoint
    /// (Docker takes that as the image's cmd).
    #[test]
    fn dockers_create_document_runs_exactly_the_argv() {
        let run = SmokeRun {
            command: vec!["false".into()],
            ..SmokeRun::default()
        };
        let body = create_body("i", &run, &run.command);
        assert_eq!(body["Entrypoint"], serde_json::json!(["false"]));
        assert_eq!(body["Cmd"], serde_json::json!([]));
        let served = create_body("i", &run, &["/entry".into(), "--port".into(), "1".into()]);
        assert_eq!(served["Entrypoint"], serde_json::json!(["/entry"]));
        assert_eq!(served["Cmd"], serde_json::json!(["--port", "1"]));
    }

    #[test]
    fn the_gpu_way_is_what_the_engine_can_give() {
        let info = |dirs: bool, runtime: bool, devices: &[&str]| {
            let mut info = crate::engine::EngineInfo::default();
            if dirs {
                info.cdi_spec_dirs = vec!["/etc/cdi".into()];
            }
            if runtime {
                info.runtimes.insert("nvidia".into(), serde_json::json!({}));
            }
            info.discovered_devices = devices
                .iter()
                .map(|id| serde_json::json!({"Source": "cdi", "ID": id}))
                .collect();
            info
        };
        let version = |v: &str| crate::engine::EngineVersion {
            version: v.into(),
            ..Default::default()
        };
        let (new, old) = (version("28.5.2"), version("26.1.5"));
        // 28.3+: CDI on by default; no NVIDIA device found, the runtime works: the runtime.
        assert_eq!(
            docker_device_way(&info(true, true, &[]), &new),
            DeviceWay::Nvidia
        );
        assert_eq!(
            docker_device_way(&info(true, true, &["nvidia.com/gpu=0"]), &new),
            DeviceWay::Cdi
        );
        assert_eq!(
            docker_device_way(&info(true, false, &[]), &new),
            DeviceWay::Cdi
        );
        // Before 28.3 the engine lists nothing: spec dirs mean CDI was set up.
        assert_eq!(
            docker_device_way(&info(true, true, &[]), &old),
            DeviceWay::Cdi
        );
        assert_eq!(
            docker_device_way(&info(false, true, &[]), &old),
            DeviceWay::Nvidia
        );
    }

    #[test]
    fn a_shm_size_goes_with_a_private_ipc_only() {
        let mut run = SmokeRun {
            command: vec!["true".into()],
            shm_size: Some(1 << 24),
            ipc: Some("host".into()),
            ..SmokeRun::default()
        };
        let body = create_body("i", &run, &run.command);
        assert!(body["HostConfig"].get("ShmSize").is_none(), "{body}");
        assert_eq!(body["HostConfig"]["IpcMode"], "host");
        run.ipc = Some("private".into());
        let body = create_body("i", &run, &run.command);
        assert_eq!(body["HostConfig"]["ShmSize"], 1 << 24);
    }

    /// The answers Docker gives (recorded from dockerd 28 and 20.10 here) say what the node
    /// lacks in plain words.
    #[test]
    fn an_engines_refusal_of_devices_says_what_the_node_lacks() {
        let no_runtime = r#"could not select device driver "nvidia" with capabilities: [[gpu]]"#;
        assert!(lacking(DeviceWay::Nvidia, no_runtime).starts_with("no NVIDIA runtime"));
        let no_name = "CDI device injection failed: unresolvable CDI devices nvidia.com/gpu=7";
        assert!(lacking(DeviceWay::Cdi, no_name).starts_with("no CDI device of that name"));
        let no_cdi = r#"could not select device driver "cdi" with capabilities: []"#;
        assert!(lacking(DeviceWay::Cdi, no_cdi).starts_with("no CDI"));
    }
}
