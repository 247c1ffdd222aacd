//! The only module that talks to Docker: streams through bollard, documents (image inspect
//! and list, info, version, containers) through `transport.rs` into hallmark's own lenient
//! types (`answers.rs`). Every body is streamed; the API version is negotiated (Debian's
//! engine speaks 1.41, the cluster's a newer one) and sent with every request; timeouts are
//! long because a build of vLLM takes hours and a load of 24 GB takes minutes.
//!
//! `ssh://` engines go through the user's ssh (a control master forwarding the node's engine
//! socket, or `ssh [-F config] HOST docker system dial-stdio` as the docker CLI does), so host
//! keys are checked by ssh itself against the configured known_hosts; hallmark never turns
//! that off.

use crate::answers::{
    ContainerCreated, ContainerExit, EngineInfo, EngineVersion, ImageAnswer, ImageListed,
};
use crate::config::NodeConfig;
use crate::error::{Error, Result};
use crate::transport::{Dial, Transport, escape};
use bollard::Docker;
use bollard::query_parameters::{
    LogsOptionsBuilder, RemoveContainerOptionsBuilder, TagImageOptionsBuilder,
};
use futures_util::StreamExt;
use sha2::{Digest as _, Sha256};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

pub mod containers;

/// Per-request timeout: long enough for a multi-hour build step.
const TIMEOUT_SECS: u64 = 24 * 3600;

pub struct Engine {
    pub node: String,
    pub endpoint: String,
    /// For streams (build, load, save, push, pull, logs); documents are read through
    /// `transport` into hallmark's own lenient types.
    pub docker: Docker,
    transport: Transport,
    /// The engine's `/version` answer.
    pub version: EngineVersion,
    /// Keeps the ssh bridge of an `ssh://` engine alive as long as the engine.
    bridge: Option<SshBridge>,
    /// Whether a `tcp://` engine is reached with TLS.
    tls: bool,
    /// Containers `run_once` has created and not yet removed: what an interrupt must clean
    /// up. Locked for the whole of a creation, so an interrupt waits for one under way.
    live: Arc<tokio::sync::Mutex<Vec<String>>>,
}

impl Engine {
    pub async fn connect(node: &NodeConfig, ssh_config: Option<&Path>) -> Result<Engine> {
        let endpoint = node.engine.clone();
        let fail = |message: String| Error::Engine {
            node: node.name.to_string(),
            endpoint: endpoint.clone(),
            message,
            hint: None,
        };
        let dial = if let Some(path) = endpoint.strip_prefix("unix://") {
            Dial::Unix(PathBuf::from(path))
        } else if let Some(address) = endpoint.strip_prefix("tcp://") {
            let address = address.trim_end_matches('/').to_string();
            match &node.tls {
                Some(dir) => Dial::tls(address, dir).map_err(|e| {
                    fail(format!(
                        "cannot use the TLS files in {}: {e}",
                        dir.display()
                    ))
                })?,
                None => Dial::Tcp(address),
            }
        } else if let Some(host) = endpoint.strip_prefix("ssh://") {
            let bridge = SshBridge::new(host, ssh_config)
                .map_err(|e| fail(format!("cannot start ssh: {e}")))?;
            return Engine::connect_ssh(node, bridge).await;
        } else {
            return Err(fail("unsupported engine address".into()));
        };
        let transport = Transport::new(dial);
        let version = transport
            .negotiate()
            .await
            .map_err(|e| fail(format!("unreachable: {e}")))?;
        Ok(Engine::new(node, transport, version, None))
    }

    fn new(
        node: &NodeConfig,
        transport: Transport,
        version: EngineVersion,
        bridge: Option<SshBridge>,
    ) -> Engine {
        Engine {
            node: node.name.to_string(),
            endpoint: node.engine.clone(),
            docker: transport.bollard(TIMEOUT_SECS),
            tls: node.tls.is_some(),
            transport,
            version,
            bridge,
            live: Default::default(),
        }
    }

    /// Reaches an `ssh://` engine: through the engine forward an earlier command left on the
    /// live master (no ssh process at all), else through a new forward after asking the node
    /// where its engine listens, else through dial-stdio.
    async fn connect_ssh(node: &NodeConfig, mut bridge: SshBridge) -> Result<Engine> {
        let fail = |message: String| Error::Engine {
            node: node.name.to_string(),
            endpoint: node.engine.clone(),
            message,
            hint: Some("check `ssh HOST docker version` with the same ssh config".to_string()),
        };
        let negotiate = |socket: PathBuf| async move {
            let transport = Transport::new(Dial::Unix(socket));
            let version = transport.negotiate().await;
            (transport, version)
        };
        let open = bridge.forward_path();
        if bridge.persist
            && open.exists()
            && let (transport, Ok(version)) = negotiate(open.clone()).await
        {
            bridge.socket = open;
            return Ok(Engine::new(node, transport, version, Some(bridge)));
        }
        if let Some(remote) = bridge.ask_engine_socket().await.map_err(fail)?
            && bridge.forward_engine(&remote).await
        {
            if let (transport, Ok(version)) = negotiate(bridge.socket.clone()).await {
                return Ok(Engine::new(node, transport, version, Some(bridge)));
            }
            // Forwarded, but the node refuses the channels (sshd's AllowStreamLocalForwarding):
            // no listener that leads nowhere is left on the master for the next command.
            bridge.cancel_engine_forward(&remote).await;
        }
        bridge
            .dial_stdio()
            .map_err(|e| fail(format!("cannot start ssh: {e}")))?;
        let (transport, version) = negotiate(bridge.socket.clone()).await;
        let version = version.map_err(|e| fail(format!("unreachable: {e}")))?;
        Ok(Engine::new(node, transport, version, Some(bridge)))
    }

    /// How API requests reach the engine: `socket`, `tcp`, `ssh forward` (the ssh master
    /// forwards the node's engine socket) or `ssh dial-stdio` (a remote session each).
    pub fn via(&self) -> &'static str {
        match &self.bridge {
            Some(bridge) if bridge.task.is_some() => "ssh dial-stdio",
            Some(_) => "ssh forward",
            None if self.endpoint.starts_with("tcp://") && self.tls => "tcp+tls",
            None if self.endpoint.starts_with("tcp://") => "tcp",
            None => "socket",
        }
    }

    pub fn error(&self, message: impl Into<String>) -> Error {
        Error::Engine {
            node: self.node.clone(),
            endpoint: self.endpoint.clone(),
            message: message.into(),
            hint: None,
        }
    }

    /// For an `ssh://` engine, makes `127.0.0.1:port` on the node lead to `127.0.0.1:port`
    /// here (`ssh -R` on the connection's control master, so host keys are those already
    /// checked); `false` for other engines, which reach this machine's loopback only if
    /// they run on it.
    pub async fn forward_here(&self, port: u16) -> Result<bool> {
        let Some(bridge) = &self.bridge else {
            return Ok(false);
        };
        let spec = loopback_forward(port);
        let mut command = tokio::process::Command::from(bridge.control_command("forward", &spec));
        let output = command
            .stdout(std::process::Stdio::null())
            .output()
            .await
            .map_err(|e| self.error(format!("cannot run ssh: {e}")))?;
        if !output.status.success() {
            return Err(self.error(format!(
                "cannot open a tunnel to the registry (ssh -R 127.0.0.1:{port}): {}",
                String::from_utf8_lossy(&output.stderr).trim()
            )));
        }
        Ok(true)
    }

    /// Undoes [`Engine::forward_here`].
    pub async fn cancel_forward(&self, port: u16) {
        if let Some(bridge) = &self.bridge {
            bridge
                .control_quietly("cancel", &loopback_forward(port))
                .await;
        }
    }

    /// The API version every request carries, `1.45`.
    pub fn api_version(&self) -> &str {
        self.transport.api_version().unwrap_or_default()
    }

    /// The engine's `/info` answer.
    pub async fn info(&self) -> Result<EngineInfo> {
        self.transport
            .get("/info")
            .await
            .map_err(|e| self.error(format!("asking for /info: {e}")))?
            .ok_or_else(|| self.error("has no /info"))
    }

    /// The ids of the images that carry `key=value` as a label.
    pub async fn images_with_label(&self, key: &str, value: &str) -> Result<Vec<String>> {
        let filters = serde_json::json!({"label": [format!("{key}={value}")]});
        self.image_ids(&format!("?filters={}", escape(&filters.to_string(), "")))
            .await
    }

    /// The ids of every image the engine holds.
    pub async fn all_image_ids(&self) -> Result<Vec<String>> {
        self.image_ids("").await
    }

    /// Whether the engine lists the image `id` among its images (intermediate ones included).
    pub async fn lists(&self, id: &str) -> Result<bool> {
        let listed = self.list_images("?all=1").await?;
        Ok(listed.iter().any(|i| i.id == id))
    }

    /// The ids of the images the engine lists under the name `reference`.
    pub async fn ids_named(&self, reference: &str) -> Result<Vec<String>> {
        let filters = serde_json::json!({"reference": [reference]});
        self.image_ids(&format!("?filters={}", escape(&filters.to_string(), "")))
            .await
    }

    /// Every image the engine holds, with its tags and labels, in one request.
    pub async fn listed_images(&self) -> Result<Vec<ImageListed>> {
        self.list_images("").await
    }

    async fn list_images(&self, query: &str) -> Result<Vec<ImageListed>> {
        Ok(self
            .transport
            .get(&format!("/images/json{query}"))
            .await
            .map_err(|e| self.error(format!("listing images: {e}")))?
            .unwrap_or_default())
    }

    async fn image_ids(&self, query: &str) -> Result<Vec<String>> {
        let listed = self.list_images(query).await?;
        let mut ids: Vec<String> = listed
            .into_iter()
            .map(|i| i.id)
            .filter(|id| !id.is_empty())
            .collect();
        ids.sort();
        ids.dedup();
        Ok(ids)
    }

    /// `Ok(None)` when the engine does not hold the image.
    pub async fn inspect(&self, reference: &str) -> Result<Option<ImageAnswer>> {
        self.transport
            .get(&format!("/images/{}/json", escape(reference, "/:@")))
            .await
            .map_err(|e| self.error(format!("inspecting {reference}: {e}")))
    }

    /// Removes an image no tag names; a failure is not an error (the image may be in use by a
    /// container). Its untagged parents stay: they are the engine's build cache, which another
    /// build running at the same time may stand on (removing them failed such a build with
    /// "unknown parent image ID").
    pub async fn remove_untagged(&self, image_id: &str) {
        let options = bollard::query_parameters::RemoveImageOptionsBuilder::new()
            .noprune(true)
            .build();
        let _ = self
            .docker
            .remove_image(image_id, Some(options), None)
            .await;
    }

    pub async fn tag(&self, image_id: &str, reference: &str) -> Result<()> {
        let (repo, tag) = reference.rsplit_once(':').expect("references carry a tag");
        let options = TagImageOptionsBuilder::new().repo(repo).tag(tag).build();
        self.docker
            .tag_image(image_id, Some(options))
            .await
            .map_err(|e| self.error(format!("tagging {reference}: {e}")))
    }

    /// Runs `command` in a new container from `image` with no network; returns the exit
    /// code and the combined output. The container is removed whatever happens.
    pub async fn run_once(&self, image: &str, command: &[String]) -> Result<(i64, String)> {
        let body = serde_json::json!({
            "Image": image,
            "Cmd": command,
            "Entrypoint": [],
            "NetworkDisabled": true,
            "HostConfig": {"NetworkMode": "none"},
        });
        // Created in a task of its own, which records the container before it ends: dropping
        // this future (Ctrl-C) cannot lose a container the engine made, and the interrupt's
        // cleanup waits for the lock, so for a creation under way.
        let (transport, live) = (self.transport.clone(), Arc::clone(&self.live));
        let image_name = image.to_string();
        let id = tokio::spawn(async move {
            let mut live = live.lock().await;
            let created: ContainerCreated = transport
                .post("/containers/create", Some(&body))
                .await?
                .ok_or_else(|| format!("no such image: {image_name}"))?;
            live.push(created.id.clone());
            Ok::<_, String>(created.id)
        })
        .await
        .map_err(|e| e.to_string())
        .and_then(|created| created)
        .map_err(|e| self.error(format!("creating a container from {image}: {e}")))?;
        let outcome = self.run_created(&id).await;
        self.remove_container(&id).await;
        outcome
    }

    async fn remove_container(&self, id: &str) {
        let remove = RemoveContainerOptionsBuilder::new().force(true).build();
        let _ = self.docker.remove_container(id, Some(remove)).await;
        self.live.lock().await.retain(|live| live != id);
    }

    /// Removes every container `run_once` started and has not removed yet: called when the
    /// user interrupts hallmark, whose futures are then dropped before their own cleanup.
    pub async fn remove_live_containers(&self) {
        let mut live = self.live.lock().await;
        let remove = RemoveContainerOptionsBuilder::new().force(true).build();
        for id in live.drain(..) {
            let _ = self
                .docker
                .remove_container(&id, Some(remove.clone()))
                .await;
        }
    }

    /// The engine's own platform, `os/arch` as the OCI names them (`linux/amd64`).
    pub fn platform(&self) -> String {
        self.version.platform()
    }

    async fn run_created(&self, id: &str) -> Result<(i64, String)> {
        self.docker
            .start_container(id, None::<bollard::query_parameters::StartContainerOptions>)
            .await
            .map_err(|e| self.error(format!("starting container {id}: {e}")))?;
        let exit: ContainerExit = self
            .transport
            .post(&format!("/containers/{id}/wait"), None)
            .await
            .map_err(|e| self.error(format!("waiting for container {id}: {e}")))?
            .ok_or_else(|| self.error(format!("container {id} vanished")))?;
        if let Some(error) = exit.error() {
            return Err(self.error(format!("waiting for container {id}: {error}")));
        }
        let options = LogsOptionsBuilder::new().stdout(true).stderr(true).build();
        let mut logs = self.docker.logs(id, Some(options));
        let mut output = String::new();
        while let Some(chunk) = logs.next().await {
            match chunk {
                Ok(chunk) => output.push_str(&chunk.to_string()),
                Err(e) => {
                    return Err(self.error(format!("reading the output of container {id}: {e}")));
                }
            }
        }
        Ok((exit.status_code, output))
    }
}

/// One message of an engine's progress stream (push, pull, load), which may carry an error.
pub trait Progress {
    fn error(&self) -> Option<String>;
}

macro_rules! progress_with_error_detail {
    ($($t:ty),*) => {$(
        impl Progress for $t {
            fn error(&self) -> Option<String> {
                self.error_detail.as_ref().and_then(|d| d.message.clone())
            }
        }
    )*};
}
progress_with_error_detail!(
    bollard::models::PushImageInfo,
    bollard::models::CreateImageInfo,
    bollard::models::BuildInfo
);

/// Reads a progress stream to its end, handing each message to `each`; returns the error the
/// engine reported in it, or the stream's own, if any. Engines report a failed push, pull or
/// load inside a successful response, so the whole stream must be read.
pub async fn follow<T: Progress>(
    mut stream: impl futures_util::Stream<Item = std::result::Result<T, bollard::errors::Error>> + Unpin,
    mut each: impl FnMut(T),
) -> Option<String> {
    let mut failure = None;
    while let Some(item) = stream.next().await {
        match item {
            Ok(message) => {
                if let Some(error) = message.error() {
                    failure = Some(error);
                }
                each(message);
            }
            Err(e) => return Some(e.to_string()),
        }
    }
    failure
}

/// The way to an `ssh://` node's engine: one ssh connection (a control master, whose host key
/// ssh checked) carries every API connection. By preference the master forwards the node's
/// engine socket (`ssh -O forward -L`): each API connection is then a channel, no remote
/// process. When the node's socket cannot be found or forwarded, each API connection runs
/// `ssh HOST docker system dial-stdio` as the docker CLI does: a remote session and a docker
/// CLI start each, about 0.1 s.
struct SshBridge {
    /// Where API connections go: the master's forward, or this bridge's dial-stdio listener.
    socket: PathBuf,
    dir: tempfile::TempDir,
    /// The dial-stdio listener, when the engine socket is not forwarded.
    task: Option<tokio::task::JoinHandle<()>>,
    /// `-F config -p port -o ControlPath=...`: what reaches the control master.
    control: Vec<String>,
    control_path: PathBuf,
    destination: String,
    /// The master outlives hallmark (its socket is in the cache), or ends with the bridge.
    persist: bool,
}

/// Asked of the node's shell: the engine socket `docker` would use there. Empty when the
/// answer is not a plain socket (a docker context is chosen), then dial-stdio is used.
const ENGINE_SOCKET_QUESTION: &str = r#"if [ -n "${DOCKER_HOST:-}" ]; then echo "$DOCKER_HOST"; elif [ -z "${DOCKER_CONTEXT:-}" ] && ! grep -qs currentContext "${DOCKER_CONFIG:-$HOME/.docker}/config.json"; then echo unix:///var/run/docker.sock; fi"#;

/// The socket path in the node's answer to [`ENGINE_SOCKET_QUESTION`], if it can be
/// forwarded: `unix://` and an absolute path that `-L local:remote` can carry.
fn forwardable_socket(answer: &str) -> Option<&str> {
    let path = answer.trim().strip_prefix("unix://")?;
    let plain = |c: char| !c.is_whitespace() && !c.is_control() && c != ':';
    (path.starts_with('/') && path.chars().all(plain)).then_some(path)
}

/// `-R 127.0.0.1:port:127.0.0.1:port`: the node's loopback port leads to this machine's.
fn loopback_forward(port: u16) -> Vec<String> {
    vec!["-R".into(), format!("127.0.0.1:{port}:127.0.0.1:{port}")]
}

/// Where the control master's socket goes: `<cache>/ssh/<hash of host and ssh config>`, a
/// folder only the user can enter; in `fallback` (the bridge's own temporary folder, the
/// master then ending with hallmark) if the cache is unusable or its path too long for a
/// unix socket (ssh adds 17 bytes while it sets one up; the limit is 108).
fn control_path(host: &str, ssh_config: Option<&Path>, fallback: &Path) -> (PathBuf, bool) {
    let dir = crate::project::cache_dir().join("ssh");
    let key = format!(
        "{host}\n{}",
        ssh_config
            .map(|p| p.display().to_string())
            .unwrap_or_default()
    );
    let name = hex::encode(&Sha256::digest(key.as_bytes())[..8]);
    let path = dir.join(name);
    let private = || {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)?;
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
    };
    if path.as_os_str().len() + 17 < 104 && private().is_ok() {
        (path, true)
    } else {
        (fallback.join("control"), false)
    }
}

impl SshBridge {
    fn new(host: &str, ssh_config: Option<&Path>) -> std::io::Result<SshBridge> {
        let dir = tempfile::Builder::new().prefix("hallmark-ssh").tempdir()?;
        let (destination, port) = match host.rsplit_once(':') {
            Some((h, p)) if p.chars().all(|c| c.is_ascii_digit()) => {
                (h.to_string(), Some(p.to_string()))
            }
            _ => (host.to_string(), None),
        };
        let mut control: Vec<String> = Vec::new();
        if let Some(config) = ssh_config {
            control.extend(["-F".into(), config.display().to_string()]);
        }
        if let Some(port) = &port {
            control.extend(["-p".into(), port.clone()]);
        }
        let (control_path, persist) = control_path(host, ssh_config, dir.path());
        control.extend([
            "-o".into(),
            format!("ControlPath={}", control_path.display()),
        ]);
        Ok(SshBridge {
            socket: dir.path().join("docker.sock"),
            dir,
            task: None,
            control,
            control_path,
            destination,
            persist,
        })
    }

    /// Where the master forwards the engine socket: beside the control socket, so that the
    /// next command finds the forward open as long as the master is.
    fn forward_path(&self) -> PathBuf {
        if self.persist {
            self.control_path.with_extension("engine")
        } else {
            self.dir.path().join("engine.sock")
        }
    }

    /// `ssh` that opens the master if it is not up, or rides it. The master lives in the
    /// cache for 5 idle minutes, so the next hallmark command (distribute after build,
    /// verify, status) finds the connection open instead of paying the handshake again.
    /// BatchMode: never wait for a password or a host-key prompt; an unknown or changed
    /// host key is an error, not a question.
    fn ssh(&self) -> tokio::process::Command {
        let mut ssh = tokio::process::Command::new("ssh");
        ssh.args(&self.control).args([
            "-o",
            "ControlMaster=auto",
            "-o",
            &format!(
                "ControlPersist={}",
                if self.persist { "300" } else { "yes" }
            ),
            "-o",
            "BatchMode=yes",
        ]);
        ssh
    }

    /// Asks the node which socket its engine listens on (this opens the master, checking
    /// the host key). `Err` with ssh's own words if ssh cannot reach the node.
    async fn ask_engine_socket(&self) -> std::result::Result<Option<String>, String> {
        let output = self
            .ssh()
            .args(["--", &self.destination, ENGINE_SOCKET_QUESTION])
            .stdin(std::process::Stdio::null())
            .output()
            .await
            .map_err(|e| format!("cannot run ssh: {e}"))?;
        match output.status.code() {
            Some(255) | None => Err(format!(
                "ssh failed: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            )),
            Some(0) => Ok(
                forwardable_socket(&String::from_utf8_lossy(&output.stdout)).map(str::to_string)
            ),
            // A shell that does not speak sh: the docker CLI finds the engine instead.
            Some(_) => Ok(None),
        }
    }

    /// Has the master forward `remote` (the node's engine socket) to [`SshBridge::forward_path`].
    async fn forward_engine(&mut self, remote: &str) -> bool {
        // A forward the master still lists (its socket gone) would be "forwarded" again
        // without a socket, and a socket that outlived its master would make the bind fail:
        // both cleared first.
        self.cancel_engine_forward(remote).await;
        let forwarded = self
            .control_quietly("forward", &self.engine_forward(remote))
            .await;
        if forwarded {
            self.socket = self.forward_path();
        }
        forwarded
    }

    /// Undoes [`SshBridge::forward_engine`].
    async fn cancel_engine_forward(&self, remote: &str) {
        self.control_quietly("cancel", &self.engine_forward(remote))
            .await;
        let _ = std::fs::remove_file(self.forward_path());
    }

    /// `-L <forward path>:<the node's engine socket>`.
    fn engine_forward(&self, remote: &str) -> Vec<String> {
        let local = self.forward_path();
        vec!["-L".to_string(), format!("{}:{remote}", local.display())]
    }

    /// Runs [`SshBridge::control_command`] with its output discarded: whether it succeeded.
    async fn control_quietly(&self, operation: &str, args: &[String]) -> bool {
        tokio::process::Command::from(self.control_command(operation, args))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .await
            .is_ok_and(|status| status.success())
    }

    /// Serves [`SshBridge::socket`] here, each connection carried by `ssh HOST docker system
    /// dial-stdio`.
    fn dial_stdio(&mut self) -> std::io::Result<()> {
        self.socket = self.dir.path().join("docker.sock");
        let listener = tokio::net::UnixListener::bind(&self.socket)?;
        let mut ssh = self.ssh();
        ssh.args(["--", &self.destination, "docker", "system", "dial-stdio"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .kill_on_drop(true);
        let ssh = std::sync::Arc::new(std::sync::Mutex::new(ssh));
        self.task = Some(tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let Ok(mut child) = ssh.lock().expect("not poisoned").spawn() else {
                    continue;
                };
                tokio::spawn(async move {
                    let (mut stdin, mut stdout) = (
                        child.stdin.take().expect("piped"),
                        child.stdout.take().expect("piped"),
                    );
                    let (mut read, mut write) = client.split();
                    let up = async {
                        let _ = tokio::io::copy(&mut read, &mut stdin).await;
                        drop(stdin);
                    };
                    let down = tokio::io::copy(&mut stdout, &mut write);
                    let _ = tokio::join!(up, down);
                    let _ = child.kill().await;
                });
            }
        }));
        Ok(())
    }

    /// `ssh <control> -O <operation> [args] HOST` on the control master.
    fn control_command(&self, operation: &str, args: &[String]) -> std::process::Command {
        let mut command = std::process::Command::new("ssh");
        command
            .args(&self.control)
            .args(["-O", operation])
            .args(args)
            .arg(&self.destination)
            .stdin(std::process::Stdio::null());
        command
    }
}

impl Drop for SshBridge {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
        // A persistent master keeps the engine forward for the next command.
        if self.persist {
            return;
        }
        // Ends the control master (if one was started); its socket goes with the folder.
        let _ = self
            .control_command("exit", &[])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
    }
}

/// A `Write` whose bytes become the chunks of a request body: a bounded channel, so at most
/// a few chunks are in memory whatever the size of what is written. It hashes and counts
/// what passes (the context's sha256, a transfer's progress).
pub struct ChannelWriter {
    sender: tokio::sync::mpsc::Sender<bytes::Bytes>,
    hasher: Sha256,
    written: Option<Arc<AtomicU64>>,
}

impl ChannelWriter {
    pub fn sha256(&self) -> String {
        hex::encode(self.hasher.clone().finalize())
    }
}

impl Write for ChannelWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.hasher.update(buf);
        self.sender
            .blocking_send(bytes::Bytes::copy_from_slice(buf))
            .map_err(|_| {
                std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the engine stopped reading")
            })?;
        if let Some(counter) = &self.written {
            counter.fetch_add(buf.len() as u64, Ordering::Relaxed);
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A request body produced by `produce` on its own thread through a buffered
/// `ChannelWriter`. If `produce` fails, the body ends early (the engine then reports a
/// truncated stream) and the error is printed.
pub fn body_from_writer(
    written: Option<Arc<AtomicU64>>,
    produce: impl FnOnce(&mut std::io::BufWriter<ChannelWriter>) -> Result<()> + Send + 'static,
) -> impl futures_util::Stream<Item = bytes::Bytes> + Send + 'static {
    let (sender, receiver) = tokio::sync::mpsc::channel::<bytes::Bytes>(8);
    std::thread::spawn(move || {
        let writer = ChannelWriter {
            sender,
            hasher: Sha256::new(),
            written,
        };
        let mut buffered = std::io::BufWriter::with_capacity(256 * 1024, writer);
        let outcome = produce(&mut buffered)
            .and_then(|()| buffered.flush().map_err(|e| Error::io("request body", e)));
        if let Err(e) = outcome {
            eprint!("{}", e.render());
        }
    });
    futures_util::stream::unfold(receiver, |mut receiver| async move {
        receiver.recv().await.map(|chunk| (chunk, receiver))
    })
}

/// A blocking `Read` over byte chunks that an async task sends (an image export, read by
/// the store on a blocking thread).
pub struct StreamReader {
    receiver: tokio::sync::mpsc::Receiver<std::io::Result<bytes::Bytes>>,
    current: bytes::Bytes,
}

impl StreamReader {
    /// A reader fed through the returned sender, by whoever holds it.
    pub fn channel() -> (
        tokio::sync::mpsc::Sender<std::io::Result<bytes::Bytes>>,
        StreamReader,
    ) {
        let (sender, receiver) = tokio::sync::mpsc::channel(8);
        (
            sender,
            StreamReader {
                receiver,
                current: bytes::Bytes::new(),
            },
        )
    }
}

impl Read for StreamReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.current.is_empty() {
            match self.receiver.blocking_recv() {
                Some(chunk) => self.current = chunk?,
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current.split_to(n));
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::forwardable_socket;

    #[test]
    fn only_a_plain_unix_socket_path_is_forwarded() {
        assert_eq!(
            forwardable_socket("unix:///var/run/docker.sock\n"),
            Some("/var/run/docker.sock")
        );
        for answer in [
            "",
            "tcp://10.0.0.1:2375",
            "ssh://other",
            "unix://relative.sock",
            "unix:///a b.sock",
            "unix:///a:b.sock",
            "unix:///run/x.sock\n/etc/passwd",
        ] {
            assert_eq!(forwardable_socket(answer), None, "{answer:?}");
        }
    }
}
