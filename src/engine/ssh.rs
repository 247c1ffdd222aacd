//! The way to an `ssh://` node's engine through the user's own ssh, so host keys are checked
//! by ssh against the configured known_hosts (hallmark never turns that off): a control
//! master per node, kept in the cache for the next command; the node's engine socket
//! forwarded on it, or `docker system dial-stdio` per connection as the docker CLI does; and
//! `ssh -R` forwards that let a node reach a registry on this machine's loopback.

use super::{Address, Kind};
use sha2::{Digest as _, Sha256};
use std::path::{Path, PathBuf};

/// The way to an `ssh://` node's engine: one ssh connection (a control master, whose host key
/// ssh checked) carries every API connection. By preference the master forwards the node's
/// engine socket (`ssh -O forward -L`): each API connection is then a channel, no remote
/// process. When the node's socket cannot be found or forwarded, each API connection runs
/// `ssh HOST docker system dial-stdio` as the docker CLI does: a remote session and a docker
/// CLI start each, about 0.1 s.
pub(super) struct SshBridge {
    /// Where API connections go: the master's forward, or this bridge's dial-stdio listener.
    pub(super) socket: PathBuf,
    dir: tempfile::TempDir,
    /// The dial-stdio listener, when the engine socket is not forwarded.
    task: Option<tokio::task::JoinHandle<()>>,
    /// `-F config -p port -o ControlPath=...`: what reaches the control master.
    control: Vec<String>,
    control_path: PathBuf,
    destination: String,
    /// The master outlives hallmark (its socket is in the cache), or ends with the bridge.
    pub(super) persist: bool,
}

/// Why ssh did not do what was asked of it.
#[derive(Debug, thiserror::Error)]
pub enum SshError {
    #[error("cannot run ssh: {0}")]
    Run(std::io::Error),
    #[error(
        "ssh: no answer in {secs} s: the link or the node is frozen ({} sets how long to wait)",
        super::transport::ANSWER_TIMEOUT_ENV
    )]
    Frozen { secs: u64 },
    /// ssh's own words.
    #[error("ssh failed: {0}")]
    Failed(String),
    #[error("cannot open a tunnel to the registry (ssh -R 127.0.0.1:{port}): {stderr}")]
    Tunnel { port: u16, stderr: String },
}

/// Asked of the node's shell: the engine socket `docker` would use there. Empty when the
/// answer is not a plain socket (a docker context is chosen), then dial-stdio is used.
const ENGINE_SOCKET_QUESTION: &str = r#"if [ -n "${DOCKER_HOST:-}" ]; then echo "$DOCKER_HOST"; elif [ -z "${DOCKER_CONTEXT:-}" ] && ! grep -qs currentContext "${DOCKER_CONFIG:-$HOME/.docker}/config.json"; then echo unix:///var/run/docker.sock; fi"#;

/// The socket path in the node's answer to [`ENGINE_SOCKET_QUESTION`], if it can be
/// forwarded: `unix://` and an absolute path that `-L local:remote` can carry.
fn forwardable_socket(answer: &str) -> Option<String> {
    let address = Address::parse(answer.trim(), None).ok()?;
    let Kind::Unix(path) = address.kind() else {
        return None;
    };
    let path = path.to_str()?;
    let plain = |c: char| !c.is_whitespace() && !c.is_control() && c != ':';
    (path.starts_with('/') && path.chars().all(plain)).then(|| path.to_string())
}

/// `-R 127.0.0.1:port:127.0.0.1:port`: the node's loopback port leads to this machine's.
fn loopback_forward(port: u16) -> Vec<String> {
    vec!["-R".into(), format!("127.0.0.1:{port}:127.0.0.1:{port}")]
}

/// Where the control master's socket goes: `<cache>/ssh/<hash of host and ssh config>`, a
/// folder only the user can enter; in `fallback` (the bridge's own temporary folder, the
/// master then ending with hallmark) if the cache is unusable or its path too long for a
/// unix socket (ssh adds 17 bytes while it sets one up; the limit is 108).
fn control_path(
    host: &str,
    ssh_config: Option<&Path>,
    cache: &Path,
    fallback: &Path,
) -> (PathBuf, bool) {
    let dir = cache.join("ssh");
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
        fs_err::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
    };
    if path.as_os_str().len() + 17 < 104 && private().is_ok() {
        (path, true)
    } else {
        (fallback.join("control"), false)
    }
}

impl SshBridge {
    /// A bridge to `destination` (`[user@]host`) on `port`, its master not started yet.
    pub(super) fn new(
        destination: &str,
        port: Option<&str>,
        ssh_config: Option<&Path>,
        cache: &Path,
    ) -> std::io::Result<SshBridge> {
        let dir = tempfile::Builder::new().prefix("hallmark-ssh").tempdir()?;
        let host = match port {
            Some(port) => format!("{destination}:{port}"),
            None => destination.to_string(),
        };
        let mut control: Vec<String> = Vec::new();
        if let Some(config) = ssh_config {
            control.extend(["-F".into(), config.display().to_string()]);
        }
        if let Some(port) = port {
            control.extend(["-p".into(), port.to_string()]);
        }
        let (control_path, persist) = control_path(&host, ssh_config, cache, dir.path());
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
            destination: destination.to_string(),
            persist,
        })
    }

    /// Where the master forwards the engine socket: beside the control socket, so that the
    /// next command finds the forward open as long as the master is.
    pub(super) fn forward_path(&self) -> PathBuf {
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
    /// host key is an error, not a question. A node that does not answer, or a link that goes
    /// silent (the node gone, frozen), fails within the answer deadline
    /// (`HALLMARK_ANSWER_TIMEOUT`, at most 30 s to connect), instead of never: the master's
    /// keep-alives are a quarter of it, four missed end the master and every session on it.
    fn ssh(&self) -> tokio::process::Command {
        let limit = super::answer_timeout().as_secs().max(1);
        let mut ssh = tokio::process::Command::new("ssh");
        ssh.kill_on_drop(true);
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
            "-o",
            &format!("ConnectTimeout={}", limit.min(30)),
            "-o",
            &format!("ServerAliveInterval={}", (limit / 4).clamp(1, 15)),
            "-o",
            "ServerAliveCountMax=4",
        ]);
        ssh
    }

    /// `command`'s output within the answer deadline; ssh is killed past it (a frozen link
    /// holds a session open for as long as the master's keep-alives allow).
    async fn output_within(
        mut command: tokio::process::Command,
    ) -> std::result::Result<std::process::Output, SshError> {
        let limit = super::answer_timeout();
        command.kill_on_drop(true);
        match tokio::time::timeout(limit, command.output()).await {
            Ok(output) => output.map_err(SshError::Run),
            Err(_) => Err(SshError::Frozen {
                secs: limit.as_secs(),
            }),
        }
    }

    /// Asks the node which socket its engine listens on (this opens the master, checking
    /// the host key). `Err` with ssh's own words if ssh cannot reach the node.
    pub(super) async fn ask_engine_socket(&self) -> std::result::Result<Option<String>, SshError> {
        let mut ask = self.ssh();
        ask.args(["--", &self.destination, ENGINE_SOCKET_QUESTION])
            .stdin(std::process::Stdio::null());
        let output = Self::output_within(ask).await?;
        match output.status.code() {
            Some(255) | None => Err(SshError::Failed(
                String::from_utf8_lossy(&output.stderr).trim().to_string(),
            )),
            Some(0) => Ok(forwardable_socket(&String::from_utf8_lossy(&output.stdout))),
            // A shell that does not speak sh: the docker CLI finds the engine instead.
            Some(_) => Ok(None),
        }
    }

    /// Has the master forward `remote` (the node's engine socket) to [`SshBridge::forward_path`].
    pub(super) async fn forward_engine(&mut self, remote: &str) -> bool {
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
    pub(super) async fn cancel_engine_forward(&self, remote: &str) {
        self.control_quietly("cancel", &self.engine_forward(remote))
            .await;
        let _ = fs_err::remove_file(self.forward_path());
    }

    /// `-L <forward path>:<the node's engine socket>`.
    fn engine_forward(&self, remote: &str) -> Vec<String> {
        let local = self.forward_path();
        vec!["-L".to_string(), format!("{}:{remote}", local.display())]
    }

    /// Whether the control master still answers (`ssh -O check`): after a failed transfer,
    /// whether the link itself ended (its keep-alives unanswered, or cut).
    pub(super) async fn master_answers(&self) -> bool {
        self.control_quietly("check", &[]).await
    }

    /// Runs [`SshBridge::control_command`] with its output discarded: whether it succeeded.
    async fn control_quietly(&self, operation: &str, args: &[String]) -> bool {
        let mut command = tokio::process::Command::from(self.control_command(operation, args));
        command.stdout(std::process::Stdio::null());
        Self::output_within(command)
            .await
            .is_ok_and(|output| output.status.success())
    }

    /// Serves [`SshBridge::socket`] here, each connection carried by `ssh HOST docker system
    /// dial-stdio`.
    pub(super) fn dial_stdio(&mut self) -> std::io::Result<()> {
        self.socket = self.dir.path().join("docker.sock");
        let listener = tokio::net::UnixListener::bind(&self.socket)?;
        let mut ssh = self.ssh();
        // ssh's stderr is a pipe of hallmark's, passed on line by line, never hallmark's own:
        // a control master is handed the stderr of each session it carries and holds it until
        // the node's end closes, which a hung engine never does; holding the user's, it kept
        // `hallmark status | cat` waiting after hallmark had exited (outside test).
        ssh.args(["--", &self.destination, "docker", "system", "dial-stdio"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        let ssh = std::sync::Arc::new(std::sync::Mutex::new(ssh));
        self.task = Some(tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let Ok(mut child) = ssh.lock().expect("not poisoned").spawn() else {
                    continue;
                };
                if let Some(stderr) = child.stderr.take() {
                    tokio::spawn(async move {
                        use tokio::io::AsyncBufReadExt as _;
                        let mut lines = tokio::io::BufReader::new(stderr).lines();
                        while let Ok(Some(line)) = lines.next_line().await {
                            crate::output::stderr(&line);
                        }
                    });
                }
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

    /// Whether each API connection runs `docker system dial-stdio` (no forwarded socket).
    pub(super) fn dials_stdio(&self) -> bool {
        self.task.is_some()
    }

    /// Makes `127.0.0.1:port` on the node lead to `127.0.0.1:port` here (`ssh -R` on the
    /// control master, so host keys are those already checked). `Err` says why.
    pub(super) async fn forward_loopback(&self, port: u16) -> Result<(), SshError> {
        let spec = loopback_forward(port);
        let mut command = tokio::process::Command::from(self.control_command("forward", &spec));
        command.stdout(std::process::Stdio::null());
        let output = Self::output_within(command).await?;
        if !output.status.success() {
            return Err(SshError::Tunnel {
                port,
                stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
            });
        }
        Ok(())
    }

    /// Undoes [`SshBridge::forward_loopback`].
    pub(super) async fn cancel_loopback(&self, port: u16) {
        self.control_quietly("cancel", &loopback_forward(port))
            .await;
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

#[cfg(test)]
mod tests {
    use super::forwardable_socket;

    #[test]
    fn only_a_plain_unix_socket_path_is_forwarded() {
        assert_eq!(
            forwardable_socket("unix:///var/run/docker.sock\n"),
            Some("/var/run/docker.sock".to_string())
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
