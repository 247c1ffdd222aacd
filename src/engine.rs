//! The engine module: the only code that talks to Docker, and the only user of bollard. This
//! file is the API wrapper, [`Engine`], with typed methods for images and containers; the
//! rest is in `engine/`:
//!
//! - `address.rs`: the engine address, parsed once from the cluster file or the docker CLI.
//! - `transport.rs`: one pooled HTTP connection per engine (socket, TCP, TLS, ssh bridge)
//!   carrying the negotiated API version in every request.
//! - `ssh.rs`: the ssh bridge to `ssh://` engines (control master, forwards, dial-stdio).
//! - `answers.rs`: documents engines answer (inspect, list, info, version), read leniently.
//! - `progress.rs`: what engines report while they build, push, pull and load.
//! - `body.rs`: streamed request bodies and blocking readers over answer bodies.
//!
//! Streams (build, load, export, push, pull, logs) go through bollard, documents through the
//! transport into hallmark's own types. Every body is streamed; the API version is negotiated
//! (Debian's engine speaks 1.41, the cluster's a newer one); timeouts are long because a build
//! of vLLM takes hours and a load of 24 GB takes minutes.

pub mod credentials;
pub mod kind;

mod address;
pub mod answers;
mod body;
mod progress;
mod ssh;
pub mod stall;
mod transport;
pub mod view;

pub use address::{Address, Kind};
pub use answers::{EngineInfo, EngineVersion, HistoryStep, ImageAnswer, ImageListed};
pub use body::{Body, ChannelWriter, StreamReader, body_from_writer};
pub use progress::{
    BuildEvent, FollowError, ProgressDetail, ProgressEvent, Reports, StreamError, follow,
};

use crate::engine::credentials::Credentials;
use crate::error::{Error, Result};
use answers::{ContainerCreated, ContainerExit};
use bollard::Docker;
use bollard::query_parameters::{
    BuildImageOptionsBuilder, CreateImageOptionsBuilder, ImportImageOptionsBuilder,
    LogsOptionsBuilder, PushImageOptionsBuilder, RemoveContainerOptionsBuilder,
    RemoveImageOptionsBuilder, TagImageOptionsBuilder,
};
use futures_util::StreamExt;
pub use kind::{ImageStore, Product, Reach};
use ssh::SshBridge;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use transport::{Dial, Transport, escape, with_causes};
pub use transport::{LONGEST_DEADLINE_SECS, answer_timeout};
pub use view::ImageView;

mod capture;
pub mod containers;
pub mod emulation;
pub mod smoke;

/// Up to how many images are listed by name ([`Engine::listed_images_named`]): a filter of
/// that many names is a few kilobytes of query at most.
pub const NAMES_IN_A_FILTER: usize = 1000;

/// The environment variable that sets how long a smoke test may run, in seconds.
pub const SMOKE_TIMEOUT_ENV: &str = "HALLMARK_SMOKE_TIMEOUT";

/// Every deadline the environment may set, checked before anything runs: one that is set
/// and not a number of seconds in range is an error naming it (it was read as the default,
/// silently).
pub fn check_deadline_env() -> Result<()> {
    for name in [
        SMOKE_TIMEOUT_ENV,
        transport::ANSWER_TIMEOUT_ENV,
        stall::STALL_TIMEOUT_ENV,
    ] {
        if let Ok(value) = std::env::var(name)
            && transport::seconds(&value).is_none()
        {
            return Err(Error::usage(format!(
                "{name}=`{value}` is not a number of seconds: write a whole number from 1 to {LONGEST_DEADLINE_SECS} (a week), or unset it for the default"
            )));
        }
    }
    Ok(())
}

/// How long a smoke test's container may run: 1800 s, or `HALLMARK_SMOKE_TIMEOUT`.
fn smoke_timeout() -> std::time::Duration {
    transport::seconds_from_env(SMOKE_TIMEOUT_ENV, 1800)
}

/// Per-request timeout: long enough for a multi-hour build step.
const TIMEOUT_SECS: u64 = 24 * 3600;

pub struct Engine {
    pub node: String,
    /// The address as written, for messages.
    pub endpoint: String,
    address: Address,
    /// For streams (build, load, save, push, pull, logs); documents are read through
    /// `transport` into hallmark's own lenient types.
    docker: Docker,
    transport: Transport,
    /// The engine's `/version` answer.
    pub version: EngineVersion,
    /// Keeps the ssh bridge of an `ssh://` engine alive as long as the engine.
    bridge: Option<SshBridge>,
    /// Containers `run_once` has created and not yet removed: what an interrupt must clean
    /// up. Locked for the whole of a creation, so an interrupt waits for one under way.
    live: Arc<tokio::sync::Mutex<Vec<String>>>,
    /// What the engine answered about running other platforms (`emulation.rs`).
    platforms: tokio::sync::Mutex<
        std::collections::BTreeMap<String, std::result::Result<emulation::Execution, String>>,
    >,
}

/// Which node an engine belongs to, while connecting.
#[derive(Clone, Copy)]
struct Node<'a> {
    name: &'a str,
    address: &'a Address,
}

/// The slowest rate, in bytes a second, at which a Podman node is taken to import a load it
/// has spooled (about 22 MB/s was seen on a loaded test machine).
const PODMAN_IMPORT_RATE: f64 = 16.0 * 1024.0 * 1024.0;

impl Engine {
    /// Connects to the engine of node `name` at `address`; an ssh node's control master is
    /// kept in `cache`.
    pub async fn connect(
        name: &str,
        address: &Address,
        ssh_config: Option<&Path>,
        cache: &Path,
    ) -> Result<Engine> {
        let node = Node { name, address };
        let fail = |message: String| Error::Engine {
            node: name.to_string(),
            endpoint: address.to_string(),
            message,
            hint: None,
        };
        let dial = match address.kind() {
            Kind::Unix(path) => Dial::Unix(path.clone()),
            Kind::Tcp(address) => Dial::Tcp(address.clone()),
            Kind::Tls { address, certs } => Dial::tls(address.clone(), certs).map_err(|e| {
                fail(format!(
                    "cannot use the TLS files in {}: {e}",
                    certs.display()
                ))
            })?,
            Kind::Ssh { destination, port } => {
                let bridge = SshBridge::new(destination, port.as_deref(), ssh_config, cache)
                    .map_err(|e| fail(format!("cannot start ssh: {e}")))?;
                return Engine::connect_ssh(node, bridge).await;
            }
        };
        let transport = Transport::new(dial);
        let version = transport
            .negotiate()
            .await
            .map_err(|e| fail(format!("unreachable: {e}")))?;
        Ok(Engine::new(node, transport, version, None))
    }

    fn new(
        node: Node<'_>,
        transport: Transport,
        version: EngineVersion,
        bridge: Option<SshBridge>,
    ) -> Engine {
        Engine {
            node: node.name.to_string(),
            endpoint: node.address.to_string(),
            address: node.address.clone(),
            docker: transport.bollard(TIMEOUT_SECS),
            transport,
            version,
            bridge,
            live: Default::default(),
            platforms: Default::default(),
        }
    }

    /// Reaches an `ssh://` engine: through the engine forward an earlier command left on the
    /// live master (no ssh process at all), else through a new forward after asking the node
    /// where its engine listens, else through dial-stdio.
    async fn connect_ssh(node: Node<'_>, mut bridge: SshBridge) -> Result<Engine> {
        let fail = |message: String| Error::Engine {
            node: node.name.to_string(),
            endpoint: node.address.to_string(),
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
        if let Some(remote) = bridge
            .ask_engine_socket()
            .await
            .map_err(|e| fail(e.to_string()))?
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

    /// How API requests reach the engine.
    pub fn reach(&self) -> Reach {
        match (&self.bridge, self.address.kind()) {
            (Some(bridge), _) if bridge.dials_stdio() => Reach::SshDialStdio,
            (Some(_), _) => Reach::SshForward,
            (None, Kind::Tls { .. }) => Reach::TcpTls,
            (None, Kind::Tcp(_)) => Reach::Tcp,
            (None, _) => Reach::Socket,
        }
    }

    /// Which product answers: Podman names itself in its version's components.
    pub fn product(&self) -> Product {
        match self.version.podman() {
            Some(_) => Product::Podman,
            None => Product::Docker,
        }
    }

    /// How the engine keeps images (asks `/info` of a Docker engine).
    pub async fn store(&self) -> Result<ImageStore> {
        match self.product() {
            Product::Podman => Ok(ImageStore::Podman),
            Product::Docker => Ok(self.info().await?.docker_store()),
        }
    }

    /// Where the engine listens.
    pub fn address(&self) -> &Address {
        &self.address
    }

    pub fn error(&self, message: impl std::fmt::Display) -> Error {
        Error::Engine {
            node: self.node.clone(),
            endpoint: self.endpoint.clone(),
            message: message.to_string(),
            hint: None,
        }
    }

    /// After a failure on an `ssh://` engine: why, if its ssh link is what ended (its master
    /// gone: keep-alives unanswered for about three quarters of the answer deadline, or the
    /// link cut). A closed connection alone says neither.
    pub async fn link_ended(&self) -> Option<String> {
        let bridge = self.bridge.as_ref().filter(|b| !b.dials_stdio())?;
        match bridge.master_answers().await {
            true => None,
            false => Some(format!(
                "the ssh link to `{}` ended: it went silent (its keep-alives unanswered) or was cut",
                self.node
            )),
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
        bridge
            .forward_loopback(port)
            .await
            .map_err(|e| self.error(e))?;
        Ok(true)
    }

    /// Undoes [`Engine::forward_here`].
    pub async fn cancel_forward(&self, port: u16) {
        if let Some(bridge) = &self.bridge {
            bridge.cancel_loopback(port).await;
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

    /// The images tagged with one of `references`, in one request. A containerd store spends
    /// milliseconds of work on each image it lists (Docker 26 and 28: 5-8 ms of CPU each
    /// here), so a node holding hundreds of images lists only those asked for.
    /// More than [`NAMES_IN_A_FILTER`] names, and every image is listed.
    pub async fn listed_images_named(&self, references: &[&str]) -> Result<Vec<ImageListed>> {
        if references.len() > NAMES_IN_A_FILTER {
            return self.listed_images().await;
        }
        let by_names = |names: &[&str]| {
            let filters = serde_json::json!({ "reference": names });
            format!("?filters={}", escape(&filters.to_string(), ""))
        };
        if self.product() == Product::Docker || references.len() < 2 {
            return self.list_images(&by_names(references)).await;
        }
        // Podman 4 ANDs the values of one filter (several names list nothing): a listing
        // each, an image named twice kept once.
        let mut listed: Vec<ImageListed> = Vec::new();
        for reference in references {
            for image in self.list_images(&by_names(&[reference])).await? {
                if !listed.iter().any(|seen| seen.id == image.id) {
                    listed.push(image);
                }
            }
        }
        Ok(listed)
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

    /// `reference` as this engine must be asked for it. Podman resolves a short name
    /// against its own `localhost/` names first (`hello:latest` answered with
    /// `localhost/hello:latest`, another image), so it is asked by the full name, what
    /// hallmark loaded and tagged ([`Engine::run_as_typed`] asks what its users run); Docker
    /// reads short names as Docker Hub's, as written. Ids and digests are left as they are.
    fn spelt(&self, reference: &str) -> String {
        let is_id =
            reference.starts_with("sha256:") || reference.bytes().all(|b| b.is_ascii_hexdigit());
        if self.product() == Product::Docker || is_id {
            return reference.to_string();
        }
        match crate::oci::Reference::parse(reference) {
            Ok(parsed) => parsed.qualified(),
            Err(_) => reference.to_string(),
        }
    }

    /// `Ok(None)` when the engine does not hold the image.
    pub async fn inspect(&self, reference: &str) -> Result<Option<ImageAnswer>> {
        let spelt = self.spelt(reference);
        self.transport
            .get(&format!("/images/{}/json", escape(&spelt, "/:@")))
            .await
            .map_err(|e| self.error(format!("inspecting {reference}: {e}")))
    }

    /// [`ImageView::run_as_typed`]: on Podman, a short `reference` asked as written (as a
    /// client's `run` asks it, through either API: both resolve it alike).
    pub async fn run_as_typed(&self, reference: &str) -> Result<Option<ImageAnswer>> {
        let short = crate::oci::Reference::parse(reference).is_ok_and(|r| r.is_short());
        if self.product() == Product::Docker || !short {
            return Ok(None);
        }
        self.transport
            .get(&format!("/images/{}/json", escape(reference, "/:@")))
            .await
            .map_err(|e| self.error(format!("inspecting {reference} as a client names it: {e}")))
    }

    /// The steps that made the image, newest first; `Ok(None)` when the engine does not hold
    /// it.
    pub async fn history(&self, reference: &str) -> Result<Option<Vec<HistoryStep>>> {
        let spelt = self.spelt(reference);
        self.transport
            .get(&format!("/images/{}/history", escape(&spelt, "/:@")))
            .await
            .map_err(|e| self.error(format!("asking for the history of {reference}: {e}")))
    }

    /// Removes an image no tag names; a failure is not an error (the image may be in use by a
    /// container). Its untagged parents stay: they are the engine's build cache, which another
    /// build running at the same time may stand on (removing them failed such a build with
    /// "unknown parent image ID"). An image a tag names is left alone: removing it by its id
    /// would take the tag with it (an outside test found a repaired image removed so, when
    /// the load that completed it gave it the very id it had before).
    /// Whether it was removed.
    pub async fn remove_untagged(&self, image_id: &str) -> bool {
        match self.inspect(image_id).await {
            Ok(Some(image)) if image.repo_tags.is_empty() => self.remove_name(image_id).await,
            _ => false,
        }
    }

    /// Removes the name `reference` (`docker rmi --no-prune`); the image goes only if no
    /// other tag names it. A failure is not an error.
    pub async fn untag(&self, reference: &str) {
        self.remove_name(&self.spelt(reference)).await;
    }

    async fn remove_name(&self, name: &str) -> bool {
        let options = RemoveImageOptionsBuilder::new().noprune(true).build();
        let removal = self.docker.remove_image(name, Some(options), None);
        self.answered(&format!("removing {name}"), removal)
            .await
            .is_ok()
    }

    pub async fn tag(&self, image_id: &str, reference: &crate::oci::Reference) -> Result<()> {
        let options = TagImageOptionsBuilder::new()
            .repo(reference.name())
            .tag(reference.tag_or_latest())
            .build();
        let tagging = self.docker.tag_image(image_id, Some(options));
        self.answered(&format!("tagging {reference}"), tagging)
            .await
    }

    /// Builds an image from `context` (a tar holding `Dockerfile`) with the classic builder;
    /// the build's output, failure and image id come as the stream goes. Intermediate
    /// containers are removed, a failed step's too.
    pub fn build(&self, context: Body, options: &BuildOptions) -> Reports<'_, BuildEvent> {
        let mut builder = BuildImageOptionsBuilder::new()
            .dockerfile("Dockerfile")
            .rm(true)
            .forcerm(true)
            .nocache(options.no_cache)
            .networkmode(if options.network { "default" } else { "none" });
        if !options.args.is_empty() {
            builder = builder.buildargs(&options.args);
        }
        if let Some(platform) = &options.platform {
            builder = builder.platform(platform);
        }
        let tar = match context {
            Body::Bytes(bytes) => bollard::body_full(bytes),
            Body::Stream(chunks) => bollard::body_stream(chunks),
        };
        self.docker
            .build_image(builder.build(), None, Some(tar))
            .map(|item| match item {
                Ok(info) => futures_util::stream::iter(progress::build_events(info))
                    .map(Ok)
                    .left_stream(),
                Err(e) => futures_util::stream::once(async move { Err(StreamError::from(e)) })
                    .right_stream(),
            })
            .flatten()
            .boxed()
    }

    /// `docker save` of `reference`: the archive as the engine writes it, streamed.
    pub fn export(
        &self,
        reference: &str,
    ) -> futures_util::stream::BoxStream<'static, std::io::Result<bytes::Bytes>> {
        let chunks = self
            .docker
            .export_image(reference)
            .map(|chunk| chunk.map_err(|e| std::io::Error::other(with_causes(&e))))
            .boxed();
        stall::watched(
            chunks,
            stall::Moved::now(),
            stall::stall_timeout(),
            std::io::Error::other,
        )
    }

    /// `docker load` of the archive `body`; with `quiet`, the engine sends no progress bars.
    pub fn import(
        &self,
        body: impl futures_util::Stream<Item = bytes::Bytes> + Send + 'static,
        quiet: bool,
    ) -> Reports<'static, ProgressEvent> {
        let options = ImportImageOptionsBuilder::new().quiet(quiet).build();
        let moved = stall::Moved::now();
        // Podman answers a load only once it has spooled and imported the whole archive
        // (9 s of silence for 207 MB here): the deadline grows by a second per 16 MiB sent.
        let spooled = (self.product() == Product::Podman).then(|| moved.clone());
        let body = body.inspect(move |chunk| {
            if let Some(moved) = &spooled {
                moved.allow(std::time::Duration::from_secs_f64(
                    chunk.len() as f64 / PODMAN_IMPORT_RATE,
                ));
            }
        });
        let body = stall::noting(body, &moved).map(Ok::<_, std::io::Error>);
        let answers = progress::reports(self.docker.import_image_stream(options, body, None));
        stall::watched(answers, moved, stall::stall_timeout(), StreamError::Stalled)
    }

    /// Pushes `repository:tag` to the registry its name starts with, signed in with
    /// `credentials` if given. The engine sends only the layers the registry lacks.
    pub fn push(
        &self,
        repository: &str,
        tag: &str,
        credentials: Option<&Credentials>,
    ) -> Reports<'static, ProgressEvent> {
        let options = PushImageOptionsBuilder::new().tag(tag).build();
        let answers = progress::reports(self.docker.push_image(
            repository,
            Some(options),
            credentials.map(docker_credentials),
        ));
        stall::watched(
            answers,
            stall::Moved::now(),
            stall::stall_timeout(),
            StreamError::Stalled,
        )
    }

    /// Pulls `repository:tag`, signed in with `credentials` if given.
    pub fn pull(
        &self,
        repository: &str,
        tag: &str,
        credentials: Option<&Credentials>,
    ) -> Reports<'static, ProgressEvent> {
        let options = CreateImageOptionsBuilder::new()
            .from_image(repository)
            .tag(tag)
            .build();
        let answers = progress::reports(self.docker.create_image(
            Some(options),
            None,
            credentials.map(docker_credentials),
        ));
        stall::watched(
            answers,
            stall::Moved::now(),
            stall::stall_timeout(),
            StreamError::Stalled,
        )
    }

    /// Runs `command` in a new container from `image` with no network; returns the exit
    /// code and the combined output. The container is removed whatever happens.
    pub async fn run_once(&self, image: &str, command: &[String]) -> Result<(i64, String)> {
        let mut body = serde_json::json!({
            "Image": image,
            "NetworkDisabled": true,
            "HostConfig": {"NetworkMode": "none"},
        });
        containers::run_exactly(&mut body, command);
        // Created in a task of its own, which records the container before it ends: dropping
        // this future (Ctrl-C) cannot lose a container the engine made, and the interrupt's
        // cleanup waits for the lock, so for a creation under way.
        let (transport, live) = (self.transport.clone(), Arc::clone(&self.live));
        let created = tokio::spawn(async move {
            let mut live = live.lock().await;
            let created: Option<ContainerCreated> =
                transport.post("/containers/create", Some(&body)).await?;
            if let Some(created) = &created {
                live.push(created.id.clone());
            }
            Ok::<_, transport::AnswerError>(created.map(|c| c.id))
        })
        .await;
        let failed = |e: &dyn std::fmt::Display| {
            self.error(format!("creating a container from {image}: {e}"))
        };
        let id = match created {
            Ok(Ok(Some(id))) => id,
            Ok(Ok(None)) => return Err(failed(&format!("no such image: {image}"))),
            Ok(Err(e)) => return Err(failed(&e)),
            Err(e) => return Err(failed(&e)),
        };
        let outcome = self.run_created(&id).await;
        self.remove_container(&id).await;
        outcome.map(|(code, output, _)| (code, output))
    }

    async fn remove_container(&self, id: &str) {
        let remove = RemoveContainerOptionsBuilder::new().force(true).build();
        let removal = self.docker.remove_container(id, Some(remove));
        let _ = self
            .answered(&format!("removing container {id}"), removal)
            .await;
        self.live.lock().await.retain(|live| live != id);
    }

    /// Removes every container `run_once` started and has not removed yet: called when the
    /// user interrupts hallmark, whose futures are then dropped before their own cleanup.
    /// Each removal has the answer deadline: an interrupt on a frozen engine still ends
    /// (the container is then left to the engine, and said).
    pub async fn remove_live_containers(&self) {
        let live = self.live.lock();
        let Ok(mut live) = tokio::time::timeout(answer_timeout(), live).await else {
            return;
        };
        let remove = RemoveContainerOptionsBuilder::new().force(true).build();
        for id in live.drain(..) {
            let removal = self.docker.remove_container(&id, Some(remove.clone()));
            if let Err(e) = self
                .answered(&format!("removing container {id}"), removal)
                .await
            {
                crate::output::stderr_exactly(&format!("warning: {}\n", e.render()));
            }
        }
    }

    /// `request`'s answer within the answer deadline (`HALLMARK_ANSWER_TIMEOUT`): for the
    /// requests bollard sends, whose own timeout is a day long for the sake of builds. `what`
    /// says what was asked, for the error.
    pub(crate) async fn answered<T>(
        &self,
        what: &str,
        request: impl std::future::Future<Output = std::result::Result<T, bollard::errors::Error>>,
    ) -> Result<T> {
        let limit = answer_timeout();
        match tokio::time::timeout(limit, request).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(e)) => Err(self.error(format!("{what}: {}", with_causes(&e)))),
            Err(_) => Err(self.error(format!(
                "{what}: no answer in {} s: the engine is hung or overloaded ({} sets how long to wait)",
                limit.as_secs(),
                transport::ANSWER_TIMEOUT_ENV
            ))),
        }
    }

    /// The engine's own platform, `os/arch` as the OCI names them (`linux/amd64`).
    pub fn platform(&self) -> String {
        self.version.platform()
    }

    /// Starts the created container and waits for it: its exit code, its output (stdout and
    /// stderr interleaved) and its stdout alone.
    async fn run_created(&self, id: &str) -> Result<(i64, String, String)> {
        self.start_container(id).await?;
        self.finished(id).await
    }

    /// Waits for the started container `id` to stop: its exit code, output and stdout.
    async fn finished(&self, id: &str) -> Result<(i64, String, String)> {
        // Not a document's deadline (60 s): a smoke test may import a framework for minutes.
        let limit = smoke_timeout();
        let exit: ContainerExit = self
            .transport
            .post_within(
                &format!("/containers/{id}/wait"),
                (limit, SMOKE_TIMEOUT_ENV),
            )
            .await
            .map_err(|e| self.error(format!("waiting for container {id}: {e}")))?
            .ok_or_else(|| self.error(format!("container {id} vanished")))?;
        if let Some(error) = exit.error() {
            return Err(self.error(format!("waiting for container {id}: {error}")));
        }
        let options = LogsOptionsBuilder::new().stdout(true).stderr(true).build();
        let mut logs = self.docker.logs(id, Some(options));
        let mut captured = capture::Captured::default();
        // The container has stopped: its whole output is there to read, each chunk within
        // the answer deadline; only its tails are kept.
        let what = format!("reading the output of container {id}");
        while let Some(chunk) = self
            .answered(&what, async { logs.next().await.transpose() })
            .await?
        {
            captured.push(&chunk);
        }
        let (output, stdout) = captured.into_texts();
        Ok((exit.status_code, output, stdout))
    }
}

/// How [`Engine::build`] builds.
#[derive(Debug, Clone, Default)]
pub struct BuildOptions {
    /// Every step anew, none from the build cache.
    pub no_cache: bool,
    /// Whether RUN steps have the default network; without it, none.
    pub network: bool,
    /// `--build-arg`s.
    pub args: HashMap<String, String>,
    /// The platform to build for, `os/arch[/variant]`; the builder's own if none.
    pub platform: Option<String>,
}

/// hallmark's credentials as bollard sends them (the `X-Registry-Auth` header).
fn docker_credentials(credentials: &Credentials) -> bollard::auth::DockerCredentials {
    bollard::auth::DockerCredentials {
        serveraddress: Some(credentials.registry.clone()),
        username: credentials.username.clone(),
        password: credentials.password.clone(),
        identitytoken: credentials.identity_token.clone(),
        ..Default::default()
    }
}
